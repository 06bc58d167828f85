"""The router's OpenAI-compatible HTTP API, driven by the official `openai` Python client.

Run by tests/integration/openai_client_test.cc against a real cluster (tiny models):
  openai_client_test.py main --base URL --target-metrics URL --draft-metrics URL
  openai_client_test.py overload --base URL --router-metrics URL
Exits non-zero on the first failed check (each check prints what it compared).
"""
import argparse
import concurrent.futures
import re
import sys
import time
import urllib.request

import openai


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def kv_used(metrics_url, component):
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    m = re.search(
        r'specd_service_kv_blocks\{component="%s",state="used"\} (\S+)' % component, body)
    return float(m.group(1)) if m else None


def router_held(metrics_url):
    """Requests the router holds: running sequences plus waiting requests."""
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^specd_router_(?:running_sequences|waiting_requests) (\S+)$', body, re.M))


def expect_bad_request(client, model, param, **kwargs):
    messages = kwargs.pop("messages", [{"role": "user", "content": "hi"}])
    try:
        client.chat.completions.create(model=model, messages=messages, **kwargs)
    except openai.BadRequestError as e:
        got = (e.body or {}).get("param") if isinstance(e.body, dict) else None
        check(got == param, f"400 names param {param!r} (got {got!r}: {e.message})")
        return
    check(False, f"{kwargs} must be a BadRequestError naming {param}")


def main_checks(args):
    client = openai.OpenAI(base_url=args.base, api_key="unused", max_retries=0, timeout=60)
    models = client.models.list()
    ids = [m.id for m in models.data]
    check(len(ids) == 1, f"GET /v1/models lists one model: {ids}")
    model = ids[0]
    msgs = [{"role": "user", "content": "Tell me about the sea."}]

    # Chat: unary and streamed give the same greedy text; the speculation block is there.
    unary = client.chat.completions.create(model=model, messages=msgs, max_tokens=24,
                                           temperature=0, extra_body={"ignore_eos": True})
    text = unary.choices[0].message.content
    check(len(text) > 0 and unary.choices[0].finish_reason == "length",
          f"chat unary answers ({unary.usage.completion_tokens} tokens, "
          f"{unary.choices[0].finish_reason})")
    check(unary.usage.completion_tokens == 24, "usage.completion_tokens == max_tokens")
    spec = unary.model_extra.get("speculation")
    check(spec is not None and spec["draft_tokens"] >= spec["accepted_tokens"] >= 0,
          f"speculation block per request: {spec}")
    chunks = list(client.chat.completions.create(
        model=model, messages=msgs, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, "streamed chat text == unary chat text (greedy)")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24,
          "include_usage: the last chunk carries usage")
    # A long system prompt sent twice: the second time its prompt tokens come from the prefix
    # cache, reported where OpenAI reports cached prompt tokens.
    system = {"role": "system",
              "content": "You answer questions about the sea, ships and weather. " * 4}
    cached = []
    for _ in range(2):
        r = client.chat.completions.create(model=model, messages=[system] + msgs, max_tokens=4,
                                           temperature=0, extra_body={"ignore_eos": True})
        details = r.usage.prompt_tokens_details
        cached.append(details.cached_tokens if details is not None else None)
        prompt_tokens = r.usage.prompt_tokens
    check(cached[0] == 0 and cached[1] is not None and 16 <= cached[1] < prompt_tokens
          and cached[1] % 16 == 0,
          f"usage.prompt_tokens_details.cached_tokens: {cached} of {prompt_tokens} prompt tokens")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finish == ["length"], f"one finish_reason in the stream: {finish}")

    # Completions: unary == streamed; logprobs.
    comp = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                     temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    ctext = comp.choices[0].text
    lp = comp.choices[0].logprobs
    check(len(lp.tokens) == 16 and len(lp.token_logprobs) == 16 and len(lp.top_logprobs[0]) <= 2,
          "completions logprobs: one entry per token, top-2 alternatives")
    cstream = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=16, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    check(cstream == ctext, "streamed completion text == unary completion text")

    # A seeded sampled request gives the same text twice; speculation can be chosen per request.
    kw = dict(model=model, messages=msgs, max_tokens=20, temperature=0.9, top_p=0.95, seed=1234,
              extra_body={"ignore_eos": True, "speculation": {"mode": "draft", "k": 3}})
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    check(a == b, "seeded sampled request: same text twice")
    off = client.chat.completions.create(model=model, messages=msgs, max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True,
                                                     "speculation": {"mode": "off"}})
    check(off.model_extra["speculation"]["draft_tokens"] == 0, "speculation off drafts nothing")

    # Every invalid field is a 400 naming its param.
    expect_bad_request(client, model, "temperature", temperature=5)
    expect_bad_request(client, model, "top_p", top_p=1.5)
    expect_bad_request(client, model, "max_tokens", max_tokens=0)
    expect_bad_request(client, model, "max_tokens", max_tokens=10**9)
    expect_bad_request(client, model, "presence_penalty", presence_penalty=3)
    expect_bad_request(client, model, "n", n=2)
    expect_bad_request(client, model, "seed", seed=-1)
    expect_bad_request(client, model, "top_logprobs", logprobs=True, top_logprobs=50)
    expect_bad_request(client, model, "messages[0].role",
                       messages=[{"role": "robot", "content": "hi"}])
    expect_bad_request(client, model, "messages", messages=[])
    expect_bad_request(client, model, "top_k", extra_body={"top_k": "many"})
    expect_bad_request(client, model, "min_p", extra_body={"min_p": 7})
    expect_bad_request(client, model, "speculation.mode",
                       extra_body={"speculation": {"mode": "telepathy"}})
    expect_bad_request(client, model, "speculation.k", extra_body={"speculation": {"k": 99}})
    try:
        client.completions.create(model=model, prompt=["one", "two"], max_tokens=4)
        check(False, "a batch of prompts must be refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "prompt", f"batch prompts: 400 on prompt ({e.message})")
    try:
        client.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=4)
        check(False, "an unknown model must be refused")
    except openai.NotFoundError as e:
        check(e.body.get("param") == "model", f"unknown model: 404 naming model ({e.message})")

    # A client that closes its stream cancels the request: KV freed on both services.
    stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=400,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    got = 0
    for c in stream:
        got += 1
        if got == 3:
            break
    check(kv_used(args.target_metrics, "target") > 0, "the running stream holds target KV")
    stream.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        if kv_used(args.target_metrics, "target") == 0 and kv_used(args.draft_metrics, "draft") == 0:
            break
        time.sleep(0.05)
    check(kv_used(args.target_metrics, "target") == 0, "closing the stream freed the target KV")
    check(kv_used(args.draft_metrics, "draft") == 0, "closing the stream freed the draft KV")


def overload_checks(args):
    client = openai.OpenAI(base_url=args.base, api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id

    def one(i):
        t0 = time.time()
        try:
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"count {i}"}],
                max_tokens=48, temperature=0, extra_body={"ignore_eos": True})
            return ("ok", time.time() - t0, r.usage.completion_tokens)
        except openai.RateLimitError:
            return ("429", time.time() - t0, 0)

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, range(16)))
    limited = [r for r in results if r[0] == "429"]
    served = [r for r in results if r[0] == "ok"]
    check(len(limited) > 0, f"overload: {len(limited)} of 16 got RateLimitError (429)")
    check(all(r[2] == 48 for r in served) and len(served) > 0,
          f"overload: the {len(served)} accepted requests all completed")
    slowest = max(r[1] for r in limited)
    check(slowest < 0.5, f"429s under a burst come at once (slowest {slowest * 1e3:.0f} ms)")

    # With every running and queue slot held (2 + 2), one more request is refused within 50 ms.
    # The first two are read until their first chunk, so they are running (not still waiting
    # for the scheduler, which on a loaded machine left three waiting: a 429 for the fourth).
    def hold(i):
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"hold {i}"}], max_tokens=400,
            temperature=0, stream=True, extra_body={"ignore_eos": True})
    held = []
    for i in range(2):
        held.append(hold(i))
        next(iter(held[-1]))
    held += [hold(i) for i in range(2, 4)]
    # The router must hold all four before the fifth is sent; a held stream that had already
    # finished (the target is sized so 400 tokens take far longer than this) would free a slot.
    deadline = time.time() + 5
    while router_held(args.router_metrics) != 4 and time.time() < deadline:
        time.sleep(0.01)
    check(router_held(args.router_metrics) == 4, "the router holds 2 running + 2 waiting")
    t0 = time.time()
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4)
        check(False, "a request beyond a full queue must be refused (the router then held "
              f"{router_held(args.router_metrics):.0f})")
    except openai.RateLimitError:
        took = time.time() - t0
        check(took < 0.05, f"full queue: RateLimitError in {took * 1e3:.1f} ms (< 50 ms)")
    for s in held:
        s.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["main", "overload"])
    p.add_argument("--base", required=True)
    p.add_argument("--target-metrics")
    p.add_argument("--draft-metrics")
    p.add_argument("--router-metrics")
    a = p.parse_args()
    main_checks(a) if a.mode == "main" else overload_checks(a)
    print("all checks passed")
