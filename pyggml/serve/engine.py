"""The engine: one decode loop in its own thread serving many requests over `-np` slots.

As llama-server's `server_context`: each slot owns one KV-cache sequence id (the
slots share the model's `n_ctx` cells, `n_ctx // n_slots` each); requests wait
in a FIFO queue for a free slot; each step is one `Model.decode` batch holding
the prompts of newly admitted requests and the last sampled token of every
generating slot, then one token is sampled per slot with that slot's sampler
(its grammar's mask and logit bias its own: constrained and free requests share
a batch), with the token's log-probabilities when the request asks (`n_probs`).
A slot keeps its tokens in the cache after its request ends, so a new request
whose prompt starts with them evaluates only the rest (llama-server's
`cache_prompt`; a request may refuse it) when both come from the same cache
namespace (the app's: one per API key): a client never reuses, nor learns of,
another's cached prompt.
Only this thread touches the model: results go back through each request's
`sink`, a callable the caller makes thread-safe (the ASGI app hands them to
its event loop with `call_soon_threadsafe`). An embedding request (`pooling`
set) takes a slot too; its prompt is evaluated for its hidden states in a batch
of embedding requests only (as llama-server batches a task type with its own).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError, GGMLError
from pyggml.models.model import KEEP_GRAPHS
from pyggml.models.pooling import EMBD_NORMALIZE, normalize, pool
from pyggml.models.recurrent_state import RecurrentStateError

log = logging.getLogger(__name__)


class ServeError(GGMLError):
    """A request the server cannot take (pyggml.serve's errors)."""


class QueueFullError(ServeError):
    """Too many requests are waiting for a slot."""


class EngineStoppedError(ServeError):
    """The engine's loop is not running."""


@dataclass
class TokenProb:
    """A sampled token's log-probability, and the `top` most likely tokens with theirs (most likely first), in
    the distribution it was drawn from (`Sampler.distribution`: after the logit bias, the penalties and the
    grammar's mask, before top-k, top-p, min-p and temperature; llama-server's `n_probs`)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Event:
    """What the engine tells a request's sink: `text` (a piece of the answer), `done` (finish_reason
    "stop", "length" or "cancelled", with the token counts; an embedding request's vector in `embedding`) or
    `error` (message). With `n_probs`, `probs` holds the entries of the tokens whose text starts in the piece
    (`done`: of those whose text never showed)."""

    kind: str
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    message: str = ""
    embedding: Any = None
    probs: list[TokenProb] = field(default_factory=list)


@dataclass
class GenRequest:
    """One generation: prompt token ids, at most `max_tokens` new ones, `sampler` (None: greedy argmax; a
    `Sampler` with a grammar ends the answer when the grammar is complete), `stop` strings (the answer ends
    before the first one), end-of-generation ids (not part of the answer); `namespace`: the requests whose
    cached prompts it may reuse (the same namespace's only); `cache_prompt` False: none (llama-server's field);
    `n_probs`: each token's log-probability and the n most likely ones' (`TokenProb`; None: none). With
    `pooling` ("none", "mean", "cls", "last") the request asks for the prompt's embedding instead, normalized
    by `embd_normalize` (`pyggml.models.pooling`); `info`: what /slots shows of it (its sampling settings)."""

    prompt: list[int]
    max_tokens: int
    sampler: Any = None
    stop: Sequence[str] = ()
    eog_ids: frozenset[int] = frozenset()
    sink: Callable[[Event], None] = lambda e: None
    namespace: str = ""
    cache_prompt: bool = True
    n_probs: int | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    pooling: str | None = None
    embd_normalize: int = EMBD_NORMALIZE
    info: dict[str, Any] = field(default_factory=dict)

    def cancel(self) -> None:
        """Thread-safe: the engine frees the request's slot (or drops it from the queue) at its next step."""
        self.cancelled.set()


class _Slot:
    def __init__(self, seq_id: int) -> None:
        self.id = seq_id
        self.req: GenRequest | None = None
        self.cached: list[int] = []  # the tokens of this sequence in the KV cache, positions 0..len-1
        self.namespace = ""  # whose tokens `cached` are
        self.pending: list[int] = []  # tokens to evaluate in the next batch
        self.history: list[int] = []
        self.n_gen = 0
        self.n_cached_prompt = 0
        self.decoder: Any = None
        self.text = ""  # the answer's text so far (all of it: stop strings may span pieces)
        self.sent = 0  # how much of `text` went to the sink
        self.probs: list[tuple[int, TokenProb]] = []  # the entries not sent yet, with where their text starts
        self.last_used = 0.0
        self.task = -1  # the number of the request it holds (or held last)
        self.t_start = 0.0  # when the request took the slot
        self.t_prompt = 0.0  # when its prompt was evaluated (0: not yet)


class Engine:
    """The decode loop over `model` with `n_slots` slots; `start()` runs it in a daemon thread.

    `max_queue` bounds the waiting requests (QueueFullError past it); `max_batch` the tokens of a step
    (default: the model's n_batch; the generating slots' tokens always go, prompts share the rest);
    `step_delay` sleeps that many seconds after each step (a throttle for tests that must catch a request
    mid-generation)."""

    def __init__(self, model: Any, n_slots: int = 1, max_queue: int = 256, step_delay: float = 0.0,
                 max_batch: int | None = None) -> None:
        if n_slots < 1 or n_slots > 64:
            raise ArgumentError(f"serve: the slot count must be in [1, 64], got {n_slots}")
        if model.n_ctx // n_slots < 2:
            raise ArgumentError(f"serve: {n_slots} slots over n_ctx {model.n_ctx} leave fewer than 2 cells each")
        self.model = model
        self.slots = [_Slot(i) for i in range(n_slots)]
        self.slot_ctx = model.n_ctx // n_slots  # a slot's share of the unified cache
        self.max_queue = max_queue
        self.step_delay = step_delay
        self.max_batch = max(1, max_batch if max_batch is not None else model.n_batch)  # tokens a step
        self.queue: collections.deque[GenRequest] = collections.deque()
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False
        # counters (read by tests and /health)
        self.n_steps = 0
        self.n_done = 0
        self.n_cancelled = 0
        self.n_prompt_reused = 0
        self.decode_seconds = 0.0  # wall time inside Model.decode (a step's batch), all steps
        self.decode_tokens = 0  # the tokens of those batches
        # llama-server's metrics: prompt tokens evaluated (the cached ones apart) and the slots' seconds on them,
        # tokens generated and the seconds from a prompt's end to the request's, the largest prompt + answer, the
        # busy slots summed over decode steps
        self.n_tasks = 0
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.prompt_seconds = 0.0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        self.n_tokens_max = 0
        self.busy_slot_steps = 0
        # the batches of n_slots slots come in more shapes than one sequence's (1..n_slots decoding, prompts
        # beside them): keep enough graphs that none is built again (a build costs several decode steps)
        if hasattr(model, "set_keep_graphs"):
            model.set_keep_graphs(max(model.keep_graphs, KEEP_GRAPHS + 2 * n_slots))
        model.reset()

    # --- the caller's side (any thread) ---

    def start(self) -> Engine:
        self.thread = threading.Thread(target=self._run, name="pyggml-serve-engine", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout)

    def submit(self, req: GenRequest) -> GenRequest:
        """Queue `req`; its events go to `req.sink` from the engine's thread."""
        if len(req.prompt) == 0:
            raise ArgumentError("serve: the prompt has no tokens")
        if len(req.prompt) + max(req.max_tokens, 0) > self.slot_ctx:
            raise ArgumentError(f"serve: {len(req.prompt)} prompt tokens + max_tokens {req.max_tokens} exceed a "
                                f"slot's context of {self.slot_ctx} tokens")
        with self.cond:
            if self.stopping or self.thread is None or not self.thread.is_alive():
                raise EngineStoppedError("serve: the engine is not running")
            if len(self.queue) >= self.max_queue:
                raise QueueFullError(f"serve: {len(self.queue)} requests are already waiting for a slot")
            self.queue.append(req)
            self.cond.notify_all()
        return req

    def busy_slots(self) -> int:
        return sum(s.req is not None for s in self.slots)

    def waiting(self) -> int:
        return len(self.queue)

    # --- the loop (the engine's thread only) ---

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and not self.queue and all(s.req is None for s in self.slots):
                    self.cond.wait(timeout=1.0)
                if self.stopping:
                    break
            try:
                self._step()
            except Exception as e:  # a failed batch ends the requests in it; the server goes on
                log.exception("serve: a decode step failed")
                for s in self.slots:
                    if s.req is not None:
                        self._forget(s)
                        self._finish(s, error=f"{type(e).__name__}: {e}")
            if self.step_delay:
                time.sleep(self.step_delay)
        for s in self.slots:  # tell the requests still running that nothing more comes
            if s.req is not None:
                self._finish(s, error="the server is shutting down")
        with self.cond:
            left = list(self.queue)
            self.queue.clear()
        for req in left:
            req.sink(Event("error", message="the server is shutting down"))

    def _forget(self, s: _Slot) -> None:
        self.model.seq_rm(s.id)
        s.cached = []

    def _admit(self) -> None:
        """Move waiting requests to free slots: the one whose cached tokens share the longest prefix with the
        prompt (cached by the request's namespace), else the least recently used (its cache is dropped)."""
        while True:
            free = [s for s in self.slots if s.req is None]
            with self.cond:
                while self.queue and self.queue[0].cancelled.is_set():
                    req = self.queue.popleft()
                    self.n_cancelled += 1
                    req.sink(Event("done", finish_reason="cancelled", prompt_tokens=len(req.prompt)))
                if not free or not self.queue:
                    return
                req = self.queue.popleft()
            best, best_n = None, -1
            for s in free:
                same = s.namespace == req.namespace and req.cache_prompt
                n = _common_prefix(s.cached, req.prompt) if same else 0
                if n > best_n or (n == best_n and best is not None and s.last_used < best.last_used):
                    best, best_n = s, n
            assert best is not None
            keep = min(best_n, len(req.prompt) - 1)  # the last prompt token is evaluated again: its logits
            if req.pooling is not None:  # every token's hidden state is wanted: nothing of the cache is reused
                keep = 0
            try:
                self.model.seq_rm(best.id, keep, -1)
            except RecurrentStateError:  # a state holds all its tokens: llama-server clears the sequence then
                self.model.seq_rm(best.id)
                keep = 0
            best.cached = best.cached[:keep]
            if keep:
                self.n_prompt_reused += 1
            best.req = req
            best.task = self.n_tasks
            self.n_tasks += 1
            best.t_start = time.perf_counter()
            best.t_prompt = 0.0
            best.namespace = req.namespace
            best.pending = req.prompt[keep:]
            best.history = list(req.prompt)
            best.n_gen = 0
            best.n_cached_prompt = keep
            best.decoder = self.model.tokenizer.stream_decoder()
            best.text = ""
            best.sent = 0
            best.probs = []

    def _step(self) -> None:
        for s in self.slots:  # cancelled requests free their slots first (cells, then the slot: a slot seen
            if s.req is not None and s.req.cancelled.is_set():  # free from another thread has no cells left)
                self.n_cancelled += 1
                self._forget(s)
                self._finish(s, reason="cancelled")
        self._admit()
        # the generating slots' next tokens first, then prompts up to the batch budget: a long prompt is
        # evaluated over several steps (as llama-server's n_batch) instead of stalling every other slot
        busy = [s for s in self.slots if s.req is not None and s.pending]
        embedding = [s for s in busy if s.req is not None and s.req.pooling is not None]
        if embedding:
            self._embed(embedding)
            busy = [s for s in busy if s not in embedding]
        if not busy:
            return
        budget = max(self.max_batch, sum(len(s.pending) == 1 for s in busy))
        active: list[tuple[_Slot, int]] = []
        for s in sorted(busy, key=lambda s: len(s.pending) > 1):
            take = min(len(s.pending), budget) if len(s.pending) > 1 else 1
            if take <= 0:
                continue
            active.append((s, take))
            budget -= take
        tokens = np.concatenate([np.asarray(s.pending[:k], dtype=np.int64) for s, k in active])
        seqs = np.repeat(np.asarray([s.id for s, _ in active], dtype=np.int64), [k for _, k in active])
        pos = np.concatenate([np.arange(len(s.cached), len(s.cached) + k) for s, k in active])
        t0 = time.perf_counter()
        logits = self.model.decode(tokens, seqs, positions=pos)  # one row per slot: its last token's
        self.decode_seconds += time.perf_counter() - t0
        self.decode_tokens += len(tokens)
        self.n_steps += 1
        self.busy_slot_steps += self.busy_slots()
        for row, (s, k) in enumerate(active):
            s.cached.extend(s.pending[:k])
            s.pending = s.pending[k:]
            if not s.pending:  # a prompt evaluated in part samples nothing yet
                try:
                    self._sample(s, logits[row])
                except GGMLError as e:  # this request's sampler or grammar: the others go on
                    self._finish(s, error=f"{type(e).__name__}: {e}")

    def _embed(self, slots: list[_Slot]) -> None:
        """Evaluate the prompts of embedding requests in one batch of hidden states; each gets its pooled,
        normalized vector (`pyggml.models.pooling`) and its slot is free again, its prompt cached."""
        tokens = np.concatenate([np.asarray(s.pending, dtype=np.int64) for s in slots])
        seqs = np.repeat(np.asarray([s.id for s in slots], dtype=np.int64), [len(s.pending) for s in slots])
        pos = np.concatenate([np.arange(len(s.cached), len(s.cached) + len(s.pending)) for s in slots])
        t0 = time.perf_counter()
        hidden = self.model.decode(tokens, seqs, positions=pos, outputs=np.ones(len(tokens), dtype=bool),
                                   embeddings=True)
        self.decode_seconds += time.perf_counter() - t0
        self.decode_tokens += len(tokens)
        self.n_steps += 1
        self.busy_slot_steps += self.busy_slots()
        start = 0
        for s in slots:
            req = s.req
            assert req is not None and req.pooling is not None
            rows = hidden[start:start + len(s.pending)]
            start += len(s.pending)
            s.cached.extend(s.pending)
            s.pending = []
            vector = pool(rows, req.pooling)
            if req.pooling != "none":  # llama-server leaves the per-token vectors as they are
                vector = normalize(vector, req.embd_normalize)
            self._prompt_done(s)
            self._finish(s, reason="stop", embedding=vector)

    def _prompt_done(self, s: _Slot) -> None:
        req = s.req
        assert req is not None
        s.t_prompt = time.perf_counter()
        self.prompt_tokens += len(req.prompt) - s.n_cached_prompt
        self.prompt_tokens_cached += s.n_cached_prompt
        self.prompt_seconds += s.t_prompt - s.t_start

    def _sample(self, s: _Slot, logits: np.ndarray) -> None:
        req = s.req
        assert req is not None
        if not s.t_prompt:
            self._prompt_done(s)
        sampler = req.sampler
        if sampler is None:
            cur, tok = logits, int(np.argmax(logits))
        else:
            cur = sampler.distribution(logits, s.history)  # the mask per sequence: slots differ in one batch
            tok = sampler.pick(cur)
            sampler.accept(tok)
        s.history.append(tok)
        if tok in req.eog_ids:  # not part of the answer, nor of its token count
            self._finish(s, reason="stop")
            return
        s.n_gen += 1
        if req.n_probs is not None:
            s.probs.append((len(s.text), token_prob(cur, tok, req.n_probs)))
        s.text += s.decoder.add(tok)
        if self._check_stop(s, final=False):
            return
        grammar = getattr(sampler, "grammar", None)
        if grammar is not None and grammar.done:  # only an end-of-generation token could follow
            s.text += s.decoder.flush()
            if not self._check_stop(s, final=True):
                self._finish(s, reason="stop")
            return
        if s.n_gen >= req.max_tokens or len(s.cached) + 1 >= self.slot_ctx:
            s.text += s.decoder.flush()
            if not self._check_stop(s, final=True):
                self._finish(s, reason="length")
            return
        s.pending = [tok]

    def _check_stop(self, s: _Slot, final: bool) -> bool:
        """Send the text that cannot be the start of a stop string; True when a stop string ended the answer."""
        req = s.req
        assert req is not None
        if req.stop:
            longest = max(len(x) for x in req.stop)
            start = max(0, s.sent - longest)
            hits = [i for i in (s.text.find(x, start) for x in req.stop if x) if i >= 0]
            if hits:
                s.text = s.text[:min(hits)]
                s.probs = [(at, p) for at, p in s.probs if at < len(s.text)]  # the tokens of the stop string go
                self._send(s, len(s.text))
                self._finish(s, reason="stop")
                return True
        hold = 0 if final else _stop_prefix_len(s.text, req.stop)
        self._send(s, len(s.text) - hold)
        return False

    def _send(self, s: _Slot, end: int) -> None:
        if end > s.sent and s.req is not None:
            n = next((i for i, (at, _) in enumerate(s.probs) if at >= end), len(s.probs))
            s.req.sink(Event("text", text=s.text[s.sent:end], probs=[p for _, p in s.probs[:n]]))
            del s.probs[:n]
            s.sent = end

    def _finish(self, s: _Slot, reason: str = "", error: str = "", embedding: Any = None) -> None:
        req = s.req
        if req is None:
            return
        s.req = None
        s.pending = []
        s.last_used = time.monotonic()
        self.n_done += 1
        if s.t_prompt:
            self.predicted_tokens += s.n_gen
            self.predicted_seconds += time.perf_counter() - s.t_prompt
            self.n_tokens_max = max(self.n_tokens_max, len(req.prompt) + s.n_gen)
        if error:
            req.sink(Event("error", message=error))
        else:
            req.sink(Event("done", finish_reason=reason, prompt_tokens=len(req.prompt), completion_tokens=s.n_gen,
                           cached_tokens=s.n_cached_prompt, embedding=embedding, probs=[p for _, p in s.probs]))
        s.probs = []


def token_prob(logits: np.ndarray, token: int, n_top: int) -> TokenProb:
    """`token`'s log-softmax in `logits` and the `n_top` highest (ties by id; tokens at -inf are not listed)."""
    wide = logits.astype(np.float64)
    top = wide.max()
    lse = top + np.log(np.exp(wide - top).sum())
    best: list[tuple[int, float]] = []
    if n_top > 0:
        k = min(n_top, wide.shape[0])
        ids = np.argpartition(-wide, k - 1)[:k] if k < wide.shape[0] else np.arange(wide.shape[0])
        ids = ids[np.lexsort((ids, -wide[ids]))]
        best = [(int(i), float(wide[i] - lse)) for i in ids if wide[i] > -np.inf]
    return TokenProb(token, float(wide[token] - lse), best)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of `text` that is the start of a stop string (held back: the next piece
    may complete it)."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best
