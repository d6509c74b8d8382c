"""Incremental detokenization gives the full decode's text after every token, and the same stops."""

from __future__ import annotations

import concurrent.futures
import random
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.detokenize import TextState, extend, full_text
from agentgrad.engine.model import QWEN_MODEL, resolve_model
from agentgrad.engine.rows import Request, Row


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

TEXTS = [
    "Answer: 42 🎉🎉 naïve café — 東京タワー 👩‍👩‍👧 done.",
    "emoji only: 🤖🧠🔥💯 and ✓ ✗ ≤ ≥ ∑ ∫ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    '[calculate(expression="12 + 30")]\n\tindent  two  spaces ,  . ! ?',
]


def every_prefix_matches(tokenizer: Any, ids: list[int]) -> None:
    state = TextState()
    for end in range(1, len(ids) + 1):
        assert extend(tokenizer, state, ids[:end]) == full_text(tokenizer, ids[:end]), ids[:end]


def byte_split(tokenizer: Any, text: str) -> list[int]:
    """The text as a model may write it: every byte its own token (both models' vocabularies hold all 256)."""
    ids = [tokenizer.convert_tokens_to_ids(_byte_token(b)) for b in text.encode()]
    assert tokenizer.unk_token_id not in ids
    return ids


def _byte_token(byte: int) -> str:
    """GPT-2's byte-level alphabet: the printable character standing for one byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    shifted, n = {}, 0
    for b in range(256):
        if b in printable:
            shifted[b] = chr(b)
        else:
            shifted[b] = chr(256 + n)
            n += 1
    return shifted[byte]


@pytest.fixture(scope="module", params=["smollm2", "qwen"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return AutoTokenizer.from_pretrained(resolve_model(None if request.param == "smollm2" else QWEN_MODEL))


def test_random_tokens_decode_to_the_full_text_after_every_token(tokenizer: Any) -> None:
    rng = random.Random(0)
    special = list(tokenizer.all_special_ids)
    for _ in range(20):
        ids = [rng.choice(special) if rng.random() < 0.05 else rng.randrange(len(tokenizer)) for _ in range(60)]
        every_prefix_matches(tokenizer, ids)


def test_multibyte_and_emoji_text_split_into_single_bytes_decodes_to_the_full_text(tokenizer: Any) -> None:
    for text in TEXTS:
        whole = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        every_prefix_matches(tokenizer, whole)
        split = byte_split(tokenizer, text)
        assert len(split) > len(whole) and full_text(tokenizer, split) == text
        every_prefix_matches(tokenizer, split)
        # a character cut in the middle by a special token, and random byte tokens that never form one
        every_prefix_matches(tokenizer, split[:3] + [tokenizer.eos_token_id] + split[3:])
        every_prefix_matches(tokenizer, [t for t in split if random.Random(t).random() < 0.7])


def test_a_decoder_that_strips_the_first_tokens_space_still_gives_the_full_text() -> None:
    """SentencePiece-style: each word carries its leading space ("▁"), stripped at the start of a decode,
    so decoding from the middle needs the tokens before it."""
    vocab = {"[UNK]": 0, "▁hello": 1, "▁world": 2, "!": 3, "▁a": 4, "b": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", clean_up_tokenization_spaces=False)
    ids = [1, 2, 3, 4, 5, 1, 1, 2, 3, 5, 4, 2]
    assert full_text(tokenizer, ids) == "hello world! ab hello hello world!b a world"
    every_prefix_matches(tokenizer, ids)
    # a tokenizer that cleans up spaces before punctuation joins text across tokens: decoded whole each time
    cleaning = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", clean_up_tokenization_spaces=True)
    every_prefix_matches(cleaning, [1, 2, 4, 3, 2, 3])


def first_stop(engine: Engine, ids: list[int], params: SamplingParams) -> tuple[str, int, str | None]:
    """The text, token count and finish reason the full decode says: the first token after which the text
    holds a stop string (the first listed, if two), cut before it; or a finish_after marker, kept."""
    for count in range(1, len(ids) + 1):
        text = engine.tokenizer.decode(ids[:count], skip_special_tokens=True)
        for stop in params.stop:
            if stop in text:
                return text[: text.index(stop)], count, "stop"
        if any(marker in text for marker in params.finish_after):
            return text, count, "stop"
    return engine.tokenizer.decode(ids, skip_special_tokens=True), len(ids), None


def test_stop_strings_stop_at_the_same_token_and_text_as_the_full_decode(engine: Engine) -> None:
    rng = random.Random(1)
    streams = [byte_split(engine.tokenizer, text) for text in TEXTS]
    streams += [list(engine.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in TEXTS]
    stops = [["🎉"], ["東京"], ["𝔫𝔦"], [" , "], ["≥ ∑", "done"], ["👧"], ["not there"]]
    checked = 0
    for ids in streams:
        for stop in stops:
            for params in (SamplingParams(stop=stop), SamplingParams(finish_after=stop)):
                request = Request([1, 2, 3], params, concurrent.futures.Future(), None)
                row = Row(request, 0, None)
                request.rows.append(row)
                for token in ids:
                    engine._append(row, token, -rng.random())
                    if row.finish_reason is not None:
                        break
                text, count, reason = first_stop(engine, ids, params)
                assert (row.text, len(row.token_ids), row.finish_reason) == (text, count, reason), (stop, ids)
                checked += reason == "stop"
    # every stop the texts hold was found (7 in each of the 2 tokenizations, as stop and as finish_after): the
    # search from the previous text's length found 8, missing those that end in a character written over tokens
    assert checked == 28
