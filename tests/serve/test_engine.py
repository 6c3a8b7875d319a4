"""The engine without HTTP: slots over one KV cache, the queue, cancellation, prompt-prefix reuse, stop strings."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest

import pyggml.models as pm
from pyggml.core.errors import ArgumentError
from pyggml.models.builtin import builtin_model_path
from pyggml.serve.engine import Engine, Event, GenRequest, QueueFullError, _stop_prefix_len

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    model = pm.load(builtin_model_path(), n_ctx=256, progress=False)
    e = Engine(model, n_slots=2, max_queue=4).start()
    yield e
    e.stop()
    model.free()


def _run(engine: Engine, prompt: list[int], max_tokens: int, **kw: object) -> tuple[str, Event]:
    q: queue.SimpleQueue[Event] = queue.SimpleQueue()
    engine.submit(GenRequest(prompt=prompt, max_tokens=max_tokens, sink=q.put, **kw))  # type: ignore[arg-type]
    text = ""
    while True:
        e = q.get(timeout=TIMEOUT)
        if e.kind == "text":
            text += e.text
        else:
            return text, e


def test_a_slot_reuses_the_prompt_it_has_cached(engine: Engine) -> None:
    ids = engine.model.tokenize("The module of the file")
    text1, done1 = _run(engine, ids, 6)
    text2, done2 = _run(engine, ids + engine.model.tokenize("path", add_bos=False), 6)
    assert done1.finish_reason == "length" and done1.completion_tokens == 6
    assert done2.cached_tokens == len(ids)  # the common prefix was kept, only the new token evaluated
    text3, done3 = _run(engine, ids, 6)
    assert (text3, done3.cached_tokens) == (text1, len(ids) - 1)  # same answer from the cached prompt


def test_limits_and_queue(engine: Engine) -> None:
    with pytest.raises(ArgumentError):
        engine.submit(GenRequest(prompt=[1] * 100, max_tokens=100))  # 200 > a slot's 128
    with pytest.raises(ArgumentError):
        engine.submit(GenRequest(prompt=[], max_tokens=1))


def test_cancelled_requests_leave_the_queue_and_the_slots() -> None:
    model = pm.load(builtin_model_path(), n_ctx=128, progress=False)
    e = Engine(model, n_slots=1, max_queue=2)  # not started: requests wait
    # submit() wants a running loop; the test steps the engine itself, so that nothing races it
    e.thread = type("T", (), {"is_alive": lambda self: True})()  # type: ignore[assignment]
    got: list[Event] = []
    reqs = [e.submit(GenRequest(prompt=[1, 50], max_tokens=50, sink=got.append, eog_ids=frozenset()))
            for _ in range(2)]
    with pytest.raises(QueueFullError):
        e.submit(GenRequest(prompt=[1, 50], max_tokens=5))
    e._step()  # the first request takes the slot
    assert e.busy_slots() == 1 and e.waiting() == 1
    reqs[1].cancel()
    reqs[0].cancel()
    e._step()
    assert e.busy_slots() == 0 and e.waiting() == 0 and e.n_cancelled == 2
    assert [x.finish_reason for x in got if x.kind == "done"] == ["cancelled", "cancelled"]
    assert model.seq_pos_max(0) == -1
    model.free()


def test_stop_prefix_is_held_back() -> None:
    assert _stop_prefix_len("hello wor", ["world"]) == 3
    assert _stop_prefix_len("hello", ["world"]) == 0
    assert _stop_prefix_len("ab", ["b", "abc"]) == 2


def test_long_prompts_are_evaluated_over_several_steps() -> None:
    """A step holds at most max_batch tokens: the generating slots' own first, then pieces of prompts. The
    answers are those of whole-prompt evaluation."""
    model = pm.load(builtin_model_path(), n_ctx=256, progress=False)
    try:
        ids = [model.tokenize(p) for p in ("The module of the file and the path", "Return the list of the")]
        e = Engine(model, n_slots=2, max_batch=3).start()
        try:
            chunked = [_run(e, x, 8)[0] for x in ids]
            qs = [queue.SimpleQueue() for _ in ids]
            for x, q in zip(ids, qs, strict=True):  # both at once: prompt pieces next to the other's tokens
                e.submit(GenRequest(prompt=x, max_tokens=8, sink=q.put, eog_ids=frozenset()))
            together = []
            for q in qs:
                text = ""
                while (ev := q.get(timeout=TIMEOUT)).kind == "text":
                    text += ev.text
                together.append(text)
            steps = e.n_steps
        finally:
            e.stop()
        model.reset()
        whole = []
        for x in ids:
            model.reset()
            dec = model.tokenizer.stream_decoder()
            whole.append("".join(dec.add(t) for t in model.generate(x, 8, stop_at_eos=False)) + dec.flush())
        assert chunked == whole and together == whole
        assert steps > 2 * 8  # the prompts took steps of their own
    finally:
        model.free()


@pytest.mark.parametrize("stream", [True, False])
def test_a_non_streamed_request_wakes_the_event_loop_once_for_its_text(engine: Engine, stream: bool) -> None:
    """Server.start: a streamed request gets an event per piece of text; a non-streamed one its whole text in
    one event just before the end (the same text)."""
    import asyncio

    pytest.importorskip("starlette")
    from pyggml.serve.app import Server

    server = Server(engine)
    ids = engine.model.tokenize("The module")

    async def collect() -> list[Event]:
        events = server.start(GenRequest(prompt=ids, max_tokens=12), stream=stream)
        got = []
        while not got or got[-1].kind == "text":
            got.append(await asyncio.wait_for(events.get(), TIMEOUT))
        return got

    got = asyncio.run(collect())
    want_text, want_end = _run(engine, ids, 12)
    assert "".join(e.text for e in got[:-1]) == want_text and got[-1].completion_tokens == want_end.completion_tokens
    assert got[-1].kind == "done" and want_end.completion_tokens == 12
    assert (len(got) == 2) == (not stream)  # streamed: one event per piece (12 tokens make several pieces)
