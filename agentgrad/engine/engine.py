"""The engine: one causal LM that serves generations and trains, on the same weights.

Generation runs in one background thread with continuous batching: requests that arrive
while a batch decodes join it at the next step (their prompts are prefilled, `prefill.py`, and
their KV cache rows merged in), and finished rows leave it. Each sampled token comes with its
log-probability under the distribution it was actually drawn from (after temperature and
top-p), which is what RL needs as the old policy; under a grammar, the model's distribution
before the grammar's mask, with how many tokens the grammar allowed (`sampling.py`).

Training uses `engine.model` (fp32 master weights). Sampling may use a bf16 copy, which is
~2.7× faster on CPUs with AVX512-bf16 (`weights.py`); `publish()` copies the trained weights
into it and bumps `version`, so the very next request runs on them.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agentgrad.engine.adapters import Adapters, forward_arguments
from agentgrad.engine.decode import LeanDecoder
from agentgrad.engine.kv_cache import (
    KV_POOL,
    Batch,
    drop_finished,
    held_bytes,
    hold_prefix_once,
    restack,
    row_kv,
    unshare_prefix,
)
from agentgrad.engine.model import resolve_model
from agentgrad.engine.params import SamplingParams, check_prompt
from agentgrad.engine.prefill import Prefiller, prefill_groups
from agentgrad.engine.prefix_cache import PREFIX_CACHE_BYTES, LayerKV, PrefixCache
from agentgrad.engine.rows import Generation, Request, Row, TokenCallback
from agentgrad.engine.sampling import sample
from agentgrad.engine.slots import SlotBatch, StaticDecoding
from agentgrad.engine.threads import ThreadChooser, in_own_thread, limit_malloc_arenas, return_free_memory
from agentgrad.engine.turns import SampledTurns
from agentgrad.engine.weights import default_sampling_dtype, load_weights

log = logging.getLogger(__name__)

BATCH_WINDOW_SECONDS = 0.01
"""When idle, how long to wait after a request for more to arrive before starting a batch."""
MAX_BATCH_WINDOW_SECONDS = 0.1
TRIM_EVERY_REQUESTS = 16
"""Requests finished between two `malloc_trim`s (`return_free_memory`) on a CPU. The keys, values and temporaries of
a few MB that decoding frees come from glibc's heap and stayed resident: over the SQL demo's validation (120 episodes,
~550 requests) the process grew from 6.0 to 12.5 GB, 5.9 of which a trim at its end gave back (issue 43)."""
FINISHED_SHARE_TO_DROP = 0.25
"""Finished rows ride along in a batch (computed, their tokens ignored) until they are this share of
it, or new requests join: dropping them moves later rows' KV caches into their places
(`kv_cache.drop_finished`); when that copied the whole cache, dropping rows one at a time cost a third
of decoding."""


DECODE_MODES = ("auto", "static", "dynamic")


class Engine:
    """`Engine()` loads SmolLM2-135M-Instruct; `Engine("path/or/hf-id")` any causal LM."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str | None = None,
        sampling_dtype: torch.dtype | str | None = None,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        name: str | None = None,
        threads: int | str | None = None,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        decode: str = "auto",
        frozen_base: bool = False,
    ) -> None:
        """`threads`: how many the generation loop computes with; default `$AGENTGRAD_ENGINE_THREADS`, else every
        core; `"auto"` measures (1 or all cores, whichever is faster while other processes share them: `threads.py`).
        `prefix_cache_bytes`: memory for finished requests' keys and values, reused by later prompts that
        start with them (`prefix_cache.py`); 0 turns that off. `decode`: `"static"` decodes over the static KV cache
        (`slots.py`; replayed CUDA graphs on a GPU, `graphs.py`), `"dynamic"` over growing per-batch caches, `"auto"`
        static on a GPU and dynamic on a CPU (where the static cache is no faster: `docs/gpu.md`). `frozen_base`: the
        weights are never trained in full (served, or trained through LoRA adapters): on a GPU one copy of them, in
        the sampling dtype, then serves sampling and training (`freeze_base`)."""
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._decode_mode = decode
        self._static: StaticDecoding | None = None
        self.name = name or (Path(str(model)).name if model else "smollm2-135m")
        if isinstance(sampling_dtype, str):
            sampling_dtype = getattr(torch, sampling_dtype)
        limit_malloc_arenas()  # before the threads below take arenas of their own
        self.source = resolve_model(model)  # the folder loaded: what a vLLM server of this model starts from
        frozen = frozen_base and not self.device.startswith("cpu")  # one copy serves and trains (LoRA)
        self._weights, self.tokenizer = in_own_thread(  # no OpenMP pool left in the caller's thread (`in_own_thread`)
            load_weights, self.source, self.device, sampling_dtype or default_sampling_dtype(self.device), frozen
        )
        self.max_batch_size = max_batch_size
        configured = getattr(self.model.config, "max_position_embeddings", 4096)
        self.max_model_len: int = max_model_len if max_model_len else configured
        config_eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = {self.tokenizer.eos_token_id} | set(config_eos if isinstance(config_eos, list) else [config_eos])
        self.eos_token_ids = {t for t in eos if t is not None}
        self.version = 0
        self.weights_lock = threading.RLock()
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self._threads = ThreadChooser(threads, next(self._weights.sampler.parameters()).dtype)
        self.stats: dict[str, Any] = {
            "generated_tokens": 0,
            "prompt_tokens": 0,
            "prefill_tokens": 0,
            "prefix_cache_tokens": 0,  # prompt tokens whose keys and values came from a finished request's
            "requests": 0,
            "cancelled": 0,
            "mixed_adapter_steps": 0,  # decode steps whose batch held rows of several adapters (`adapters.py`)
            "held_once_steps": 0,  # decode steps that read their rows' shared prefix once (`kv_cache.SharedPrefix`)
            "decode_steps": 0,
            "memory_trims": 0,  # freed memory given back while serving (`TRIM_EVERY_REQUESTS`)
            "decode_rows": 0,  # rows generating, summed over decode steps: over `decode_steps`, the mean batch size
            "graph_steps": 0,  # decode steps replayed from a captured CUDA graph (`graphs.py`)
            # what ran the last decode step (`_decode`): "cuda graph", "static slots", "written-out step" or
            # "transformers forward" (", several adapters" when its batch mixed them)
            "decode": "",
        }
        self.running_rows = 0
        """Rows the running batch is generating now."""
        self._finished_since_trim = 0
        self.kv_bytes = 0
        """Bytes of keys and values the running batch holds (`kv_cache.held_bytes`)."""
        self.adapters: Adapters | None = None  # several LoRA adapters served together (`adapters.serve_adapters`)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._constrainer: Any = None
        self._live: dict[int, Request] = {}  # id(future) -> request, for `cancel`
        self._prefiller = Prefiller(self._weights, self.stats, self.tokenizer)
        self._turns = SampledTurns(self.tokenizer)
        self._waiting: list[Request] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def waiting_requests(self) -> int:
        """Requests submitted that have not joined the running batch yet."""
        return len(self._waiting)

    # ------------------------------------------------------------------ weights

    @property
    def model(self) -> Any:
        """The weights being trained (fp32 master weights, unless the base is frozen)."""
        return self._weights.model

    @property
    def sampling_dtype(self) -> torch.dtype:
        """The dtype sampling runs in."""
        return self._weights.sampling_dtype

    def freeze_base(self) -> None:
        """Hold the weights once, in the sampling dtype, for sampling and for training adapters over them (they are
        no longer trained in full): on a GPU, where a 7B model's fp32 weights beside their bf16 copy took 57.9 GiB
        (issue 41). On a CPU nothing changes (adapters train over the fp32 weights, and sampling merges them into a
        packed twin: `replace_model`). `frozen_base=True` loads them so from the start, without the fp32 copy's peak."""
        if self.device.startswith("cpu") or self._weights.sampler is self.model:
            return
        with self.weights_lock:
            self._static = None  # it holds the copy, which goes before the weights are rounded
            self._weights.freeze()
        torch.cuda.empty_cache()

    def replace_model(self, model: torch.nn.Module, *, merge: bool = False) -> None:
        """Serve and train `model` instead (a peft-wrapped copy, say); sampling then uses it directly, except with
        `merge` on a CPU that packs fp32: a packed twin with the one LoRA adapter merged in (`prepack.packed_twin`),
        made again at each `publish`. Not for adapters chosen per request (`adapters.py`): their rows need peft."""
        with self.weights_lock:
            self._weights.replace(model, merge)
            self._static = None  # its cache and graphs were the old model's
            self._prefiller.shared.clear()
            self.version += 1

    @contextmanager
    def training(self) -> Iterator[torch.nn.Module]:
        """The trainable model, with generation held off while it may change (fp32 sampling shares it). The retired
        KV buffers kept for the next batch (`kv_cache.KV_POOL`) are freed for the update's memory."""
        with self.weights_lock:
            KV_POOL.clear()
            with self._weights.training() as model:
                yield model

    def publish(self) -> int:
        """Serve the current trainable weights from the next request on; returns the new version."""
        with self.weights_lock:
            self._weights.publish()
            self.version += 1
        return_free_memory()  # the old twin's packed weights
        return self.version

    def peak_memory_bytes(self) -> int:
        """The most memory this process has held so far: on the engine's GPU what torch allocated there, on a CPU
        the resident set (what a run reports as `perf/peak_memory_gib`)."""
        if self.device.startswith("cuda"):
            return int(torch.cuda.max_memory_allocated(torch.device(self.device)))
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    # ------------------------------------------------------------------ prompts

    def chat_prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat, ready for the assistant's turn, continuing the ids an earlier turn of this
        engine was sampled as where the agent sent it back unedited (`turns.py`)."""
        return self._turns.prompt_ids(messages, tools)

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        on_token: TokenCallback | None = None,
        adapter: str | None = None,
    ) -> concurrent.futures.Future[Generation]:
        """Queue a generation; the future resolves when all its `n` completions are done. `adapter`: the LoRA
        adapter to serve it when the engine holds several (`adapters.py`; None or "base": the base model).

        Everything a request could fail on (its parameters, token ids, seed, grammar) is checked
        here, before it joins a batch, so a bad request raises ValueError alone.
        """
        params = params or SamplingParams()
        params.check(self.max_batch_size, self.vocab_size)
        check_prompt(prompt_ids, self.max_model_len, self.vocab_size)
        if self.adapters is None and adapter is not None:
            raise ValueError(f"adapter {adapter!r} asked for, but this engine serves one set of weights")
        if self.adapters is not None:
            self.adapters.check(adapter)
            adapter = adapter or self.adapters.resolve(None)
        request = Request(list(prompt_ids), params, concurrent.futures.Future(), on_token, adapter=adapter)
        template = self.constrainer().matcher(params.grammar) if params.grammar is not None else None
        for index in range(params.n):
            # a host generator: its draws are no device launches (`sampling.uniforms`)
            generator = None if params.seed is None else torch.Generator().manual_seed(params.seed + index)
            matcher = None if template is None else template.deep_copy()
            request.rows.append(Row(request, index, generator, matcher=matcher))
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._waiting.append(request)
            live = self._live  # not `self`: the future would hold the engine in a cycle, its weights until a full GC
            live[id(request.future)] = request
            request.future.add_done_callback(lambda f: live.pop(id(f), None))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentgrad-engine", daemon=True)
                self._thread.start()
                # stop the loop before the interpreter tears torch down under it (an abort otherwise)
                atexit.register(_close_at_exit, weakref.ref(self))
            self._cv.notify()
        return request.future

    def cancel(self, future: concurrent.futures.Future[Generation]) -> None:
        """Stop generating for `future` (its client went away); it resolves with what was written, finish "cancelled"."""
        with self._cv:
            request = self._live.get(id(future))
            if request is None or request.cancelled:
                return
            request.cancelled = True
            if request in self._waiting:  # never started: resolve it here
                self._waiting.remove(request)
                for row in request.rows:
                    row.finish_reason = "cancelled"
                self._resolve(request)
            self.stats["cancelled"] += 1

    def constrainer(self) -> Any:
        """The llguidance tokenizer for this model, built on first use (~1 s)."""
        if self._constrainer is None:
            from agentgrad.engine.constraints import Constrainer

            self._constrainer = Constrainer(self.tokenizer, self.vocab_size)
        return self._constrainer

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None) -> list[Generation]:
        """Generate for several prompts at once (batched), blocking until all are done."""
        futures = [self.submit(prompt, params) for prompt in prompts]
        return [future.result() for future in futures]

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(30)
        self._static = None
        KV_POOL.clear()
        return_free_memory()

    # ------------------------------------------------------------------ the generation loop

    def _take_waiting(self, capacity: int, block: bool) -> list[Request]:
        with self._cv:
            if block:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                began = time.monotonic()
                seen = len(self._waiting)
                while not self._closed and sum(r.params.n for r in self._waiting) < capacity:
                    self._cv.wait(BATCH_WINDOW_SECONDS)
                    if len(self._waiting) == seen or time.monotonic() - began > MAX_BATCH_WINDOW_SECONDS:
                        break
                    seen = len(self._waiting)
            taken: list[Request] = []
            while self._waiting and self._waiting[0].params.n <= capacity:
                request = self._waiting.pop(0)
                capacity -= request.params.n
                taken.append(request)
            return taken

    def _run(self) -> None:
        batch: Batch | SlotBatch | None = None
        while True:
            free = self.max_batch_size - (batch.live if batch else 0)
            new = self._take_waiting(free, block=batch is None) if free > 0 else []
            if self._closed and batch is None and not new:
                return
            try:
                if self.device == "cpu":
                    self.stats["threads"] = self._threads.apply()
                with self.weights_lock, torch.inference_mode():
                    for added in self._prefill(new) if new else []:
                        batch = self._join(batch, added)
                        batch = self._drop_finished(batch)
                    if batch is not None:
                        batch = self._drop_finished(self._decode(batch))
                self.running_rows, self.kv_bytes = (
                    (batch.live, self._held_bytes(batch)) if batch is not None else (0, 0)
                )
            except Exception as exc:  # fail the requests in flight, keep serving the next ones
                log.exception("generation failed")
                failed = {id(row.request): row.request for row in (batch.rows if batch else [])}
                failed.update({id(r): r for r in new})
                for request in failed.values():
                    if not request.future.done():
                        request.future.set_exception(exc)
                batch = None

    def _prefill(self, requests: list[Request]) -> list[Batch]:
        """Run the new prompts and sample their first tokens, one prefill per group (`prefill.prefill_groups`)."""
        batches = []
        for group, cached in prefill_groups(requests, self.prefix_cache, self.version):
            self.stats["prefix_cache_tokens"] += cached[0] * len(group)
            batches.append(self._prefill_together(group, cached))
        return batches

    def _prefill_together(self, requests: list[Request], cached: tuple[int, LayerKV] = (0, [])) -> Batch:
        """Run these prompts (`prefill.Prefiller.run`) and sample their first tokens; the prefix they share held once
        where the decode step reads it so."""
        prefilled = self._prefiller.run(requests, cached, self.version, self.adapters)
        if prefilled.prefix is not None and self._holds_prefixes_once():
            hold_prefix_once(prefilled.batch, prefilled.prefix)
        self._take_tokens(prefilled.batch, prefilled.logits)
        return prefilled.batch

    def _lean_decoder(self) -> LeanDecoder | None:
        """The written-out decode step, where it serves: it alone reads a prefix held once (`kv_cache.SharedPrefix`)
        and the static cache (`slots.py`). Several adapters served together decode through transformers' forward
        (peft's mixed batches), eagerly: `stats["decode"]` says so."""
        return self._weights.decoder if self.adapters is None else None

    def _holds_prefixes_once(self) -> bool:
        """Whether a batch's shared prefix is held once (`kv_cache.SharedPrefix`): where the written-out step reads
        the dynamic cache on a CPU (its cascade attention is the CPU kernel's)."""
        return self.device.startswith("cpu") and self._lean_decoder() is not None and self._static_decoding() is None

    def _static_decoding(self) -> StaticDecoding | None:
        """The static KV cache's decoding where it serves (`decode`; the written-out step), made on first use."""
        if self._decode_mode == "dynamic" or self._lean_decoder() is None:
            return None
        if self._decode_mode == "auto" and self.device.startswith("cpu"):
            return None
        if self._static is None:
            device = torch.device(self.device)
            self._static = StaticDecoding(
                self._weights.sampler, self.max_batch_size, self.max_model_len, device, graphs=device.type == "cuda"
            )
        return self._static

    def _join(self, running: Batch | SlotBatch | None, added: Batch) -> Batch | SlotBatch:
        """The running batch with a prefilled one's rows after its own: in slots of the static cache where it
        decodes (`slots.StaticDecoding.join`), else in place in the running batch's buffers (`kv_cache.restack`)."""
        if isinstance(running, Batch):
            return restack(running, added, self.max_batch_size)
        static = self._static_decoding()
        if static is None:
            if running is not None:  # its slots went with the weights they were computed by (`replace_model`)
                self._abandon(running)
            return added
        return static.join(running, added)

    def _held_bytes(self, batch: Batch | SlotBatch) -> int:
        """Bytes of keys and values the running batch holds: the static cache's buffers where it decodes in slots."""
        if isinstance(batch, SlotBatch):
            return self._static.cache.bytes if self._static is not None else 0
        return held_bytes(batch)

    def _abandon(self, batch: SlotBatch) -> None:
        """Fail the rows of a static batch whose cache is gone (the model was replaced mid-generation)."""
        error = RuntimeError("the engine's model was replaced while this request was generating: send it again")
        for row in batch.rows:
            row.request.fail(error)

    def _decode(self, batch: Batch | SlotBatch) -> Batch | SlotBatch | None:
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += batch.live
        if isinstance(batch, SlotBatch):
            return self._decode_in_slots(batch)
        decoder = self._lean_decoder()
        if decoder is None:
            unshare_prefix(batch, 0)
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        if decoder is not None:
            self.stats["held_once_steps"] += batch.prefix is not None
            self.stats["decode"] = "written-out step"
            logits = decoder(batch.last, batch.positions, batch.mask, batch.cache, batch.prefix)
        else:
            adapters: list[str | None] = []
            if self.adapters is not None:  # each row its own adapter, in one forward pass
                adapters = [row.request.adapter for row in batch.rows]
                self.stats["mixed_adapter_steps"] += len(set(adapters)) > 1
            self.stats["decode"] = "transformers forward" + (", several adapters" if adapters else "")
            logits = self._weights.sampler(
                input_ids=batch.last[:, None],
                attention_mask=batch.mask,
                position_ids=batch.positions[:, None],
                cache=batch.cache,
                use_cache=True,
                **forward_arguments(self.adapters, adapters),
            ).logits[:, -1, :]
        batch.positions = batch.positions + 1
        self._take_tokens(batch, logits)
        return batch

    def _decode_in_slots(self, batch: SlotBatch) -> SlotBatch | None:
        """One step over the static cache: a replayed CUDA graph on a GPU."""
        decoder, static = self._lean_decoder(), self._static
        if decoder is None or static is None:  # the model was replaced mid-generation
            self._abandon(batch)
            return None
        logits = static.logits(decoder, batch)
        graphs = static.graphs is not None
        self.stats["graph_steps"] += graphs
        self.stats["decode"] = "cuda graph" if graphs else "static slots"
        self._take_tokens(batch, logits)
        return batch

    def _take_tokens(self, batch: Batch | SlotBatch, logits: torch.Tensor) -> None:
        """Sample one token per row (under its grammar, if any), record it with its logprob, mark rows done."""
        allowed = [
            None if row.matcher is None or row.finish_reason is not None else self.constrainer().allowed(row.matcher)
            for row in batch.rows
        ]
        sampled = sample(
            logits.float(),
            [row.request.params for row in batch.rows],
            [row.generator for row in batch.rows],
            histories=[row.token_ids for row in batch.rows],
            allowed=allowed,
        )
        batch.last = sampled.tokens.to(self.device)
        for row, (token, logprob, top_ids, top_values), count in zip(batch.rows, sampled.to_host(), sampled.allowed):
            if row.finish_reason is not None:  # its request failed or was cancelled earlier in this step
                continue
            k = row.request.params.top_logprobs
            # alternatives the grammar or top_p ruled out (logprob -inf) are not alternatives
            top = [(t, v) for t, v in zip(top_ids[:k], top_values[:k]) if v > float("-inf")] if k else []
            try:
                if row.matcher is not None and not row.matcher.consume_token(token):
                    raise RuntimeError(f"the grammar refused token {token}: {row.matcher.get_error()}")
                if count is not None:
                    row.allowed.append(count)
                self._append(row, token, logprob, top)
            except Exception as exc:  # this request fails alone; the batch goes on
                log.exception("a request failed while generating")
                row.request.fail(exc)

    def _append(self, row: Row, token: int, logprob: float, top: list[tuple[int, float]] | None = None) -> None:
        self.stats["generated_tokens"] += 1
        row.append(token, logprob, top or [], self.tokenizer, self.eos_token_ids, self.max_model_len)

    def _resolve(self, request: Request) -> None:
        if not request.future.done():
            try:
                finished = [row.token_ids for row in request.rows if row.finish_reason in ("stop", "length")]
                self._turns.remember(request.prompt_ids, finished)
            except Exception:  # only a missed merge
                log.exception("could not remember a completion's sampled ids")
            request.future.set_result(request.generation())
            self._finished_since_trim += 1

    def _keep_prefix(self, batch: Batch | SlotBatch, index: int, row: Row) -> None:
        """Put a row that just finished into the prefix cache: the ids it fed the model (prompt and all but its last
        token) with their keys and values (`kv_cache.row_kv`; in slots, `slots.StaticDecoding.row_kv`)."""
        row.kept = True
        if not self.prefix_cache.max_bytes or row.finish_reason not in ("stop", "length"):
            return
        fed = len(row.request.prompt_ids) + len(row.token_ids) - 1
        if isinstance(batch, SlotBatch):  # a SlotBatch has a static cache
            whole = batch.lengths[index] == fed  # its slot holds every token it fed
            kv = self._static.row_kv(batch, index, fed) if whole else None  # type: ignore[union-attr]
        else:
            kv = row_kv(batch, index, fed)
        if kv is not None:
            ids = tuple(row.request.prompt_ids + row.token_ids[:-1])
            self.prefix_cache.put(self.version, ids, kv, row.request.adapter)

    def _drop_finished(self, batch: Batch | SlotBatch | None) -> Batch | SlotBatch | None:
        if batch is None:
            return None
        for row in batch.rows:
            if row.request.cancelled and row.finish_reason is None:
                row.finish_reason = "cancelled"
        for index, row in enumerate(batch.rows):
            if row.finish_reason is not None and not row.kept:
                self._keep_prefix(batch, index, row)
        keep = [i for i, row in enumerate(batch.rows) if row.finish_reason is None]
        for row in batch.rows:
            if row.finish_reason is not None and all(r.finish_reason is not None for r in row.request.rows):
                self._resolve(row.request)
        if self._finished_since_trim >= TRIM_EVERY_REQUESTS and self.device.startswith("cpu"):
            self._finished_since_trim = 0
            self.stats["memory_trims"] += 1
            return_free_memory()
        if isinstance(batch, SlotBatch):  # moving a few rows' slots costs little: every finished row goes at once
            static = self._static
            return (
                None
                if not keep or static is None
                else batch
                if len(keep) == len(batch.rows)
                else static.drop_finished(batch)
            )
        if not keep:
            for layer in batch.cache.layers:
                layer.release()
            return None
        if len(batch.rows) - len(keep) < FINISHED_SHARE_TO_DROP * len(batch.rows):
            return batch
        return drop_finished(batch)


def _close_at_exit(engine: weakref.ref[Engine]) -> None:
    alive = engine()
    if alive is not None:
        alive.close()
