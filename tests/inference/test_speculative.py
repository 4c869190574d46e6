"""Speculative decoding (`model.draft_model`): a draft model's guesses checked by the language model in
one batch change no token of a greedy answer, are taken when right, and cost nearly nothing when wrong.

Real llama.cpp on the demo bundle and on a tiny Qwen2.5-VL GGUF + mmproj pair. Three drafts of the demo's
vocabulary: the language model itself (always right where it sees what the language model sees), its
first layer alone (models/draft.py: right sometimes) and a stranger (another random model: rarely right)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from edge_runtime_models.demo import write_demo_language
from edge_runtime_models.draft import write_layer_draft

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.bundle.manifest import Bundle, load_bundle
from edge_runtime.core.errors import ConfigError
from edge_runtime.core.samples import write_sample_video
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.draft import DraftLength
from edge_runtime.inference.llm.feed import Generation
from edge_runtime.inference.llm.handles import DecodeError
from edge_runtime.inference.llm.picker import GREEDY, Sampling
from edge_runtime.inference.llm.sequence import Prompt
from tests.support.images import synthetic_frames
from tests.support.tiny_pairs import TinyPair, write_pair_bundle
from tests.support.waiting import wait_for

FRAMES = synthetic_frames(6, seed=11)


@pytest.fixture(scope="module")
def drafts(demo_bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafts")
    write_layer_draft(demo_bundle.language_path, root / "first-layer.gguf", 1)
    write_demo_language(root / "stranger.gguf", seed=4242)
    return {"itself": demo_bundle.language_path, "first-layer": root / "first-layer.gguf",
            "stranger": root / "stranger.gguf"}


def _inspector(bundle: Bundle, config: Config, draft: Path | None, **model: object) -> Inspector:
    settings = config.model.model_copy(update={"warmup": False, "draft_model": draft, **model})
    return Inspector(bundle, settings, config.device_id)


def _verdicts(ins: Inspector, frames: list[np.ndarray] = FRAMES) -> list[Generation]:
    out = []
    for frame in frames:
        prefix, image, suffix = ins.sequence(ins.default_prompt, ins.encode(frame))
        out.append(ins.generate(prefix, image, suffix, ins.grammar, ins.max_tokens))
    return out


@pytest.fixture(scope="module")
def plain(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    with _inspector(demo_bundle, config, None) as ins:
        yield ins


@pytest.fixture(scope="module")
def plain_verdicts(plain: Inspector) -> list[Generation]:
    return _verdicts(plain)


@pytest.fixture(scope="module", params=["itself", "first-layer", "stranger"])
def drafted(request: pytest.FixtureRequest, demo_bundle: Bundle, config: Config, drafts: dict[str, Path]
            ) -> Iterator[tuple[str, Inspector]]:
    with _inspector(demo_bundle, config, drafts[request.param]) as ins:
        yield request.param, ins


def test_a_draft_changes_no_token_of_a_greedy_verdict(drafted: tuple[str, Inspector],
                                                      plain_verdicts: list[Generation]) -> None:
    _name, ins = drafted
    got = _verdicts(ins)
    assert [g.token_ids for g in got] == [g.token_ids for g in plain_verdicts]
    assert [g.text for g in got] == [g.text for g in plain_verdicts]
    assert sum(g.drafted for g in got) > 0  # the draft's guesses went into the batches


def test_the_guesses_of_a_draft_that_is_the_model_itself_are_all_taken(
        demo_bundle: Bundle, config: Config, drafts: dict[str, Path], plain_verdicts: list[Generation]) -> None:
    with _inspector(demo_bundle, config, drafts["itself"]) as ins:
        got = _verdicts(ins)
    drafted, accepted = sum(g.drafted for g in got), sum(g.draft_accepted for g in got)
    assert drafted > 0 and accepted == drafted
    # each taken guess saved its own llama_decode: fewer steps for the same tokens
    assert sum(g.steps for g in got) < sum(g.steps for g in plain_verdicts)


def test_a_draft_that_is_rarely_right_soon_stops_guessing(demo_bundle: Bundle, config: Config,
                                                          drafts: dict[str, Path]) -> None:
    with _inspector(demo_bundle, config, drafts["stranger"]) as ins:
        got = _verdicts(ins, synthetic_frames(12, seed=3))
        length = ins.language.drafter.length if ins.language.drafter else None
    assert length is not None and length.proposed == sum(g.drafted for g in got)
    tokens = sum(g.tokens for g in got)
    assert length.accepted < length.proposed / 2  # it is a stranger ...
    assert length.proposed < tokens / 3  # ... so it guesses for few of the steps, not for each token


def test_a_chat_without_a_grammar_streams_the_same_text_with_a_draft(
        demo_bundle: Bundle, config: Config, drafts: dict[str, Path], plain: Inspector) -> None:
    def chat(ins: Inspector) -> tuple[Generation, str]:
        streamed: list[str] = []
        prefix, image, suffix = ins.sequence("Describe the part.", None)
        gen = ins.generate(prefix, image, suffix, None, 40, GREEDY, streamed.append)
        return gen, "".join(streamed)

    base, base_stream = chat(plain)
    with _inspector(demo_bundle, config, drafts["itself"]) as ins:
        gen, stream = chat(ins)
    assert gen.token_ids == base.token_ids and stream == base_stream == gen.text
    assert gen.drafted > 0


def test_sampled_answers_and_rows_that_share_a_step_are_not_speculated(
        demo_bundle: Bundle, config: Config, drafts: dict[str, Path], plain: Inspector) -> None:
    # The same frame twice: both rows run every step together, neither runs alone at the end.
    twice = [FRAMES[0], FRAMES[0]]
    base = plain.generate_batch([plain.sequence(plain.default_prompt, plain.encode(f)) for f in twice],
                                plain.grammar, plain.max_tokens)
    with _inspector(demo_bundle, config, drafts["itself"]) as ins:
        items = [ins.sequence(ins.default_prompt, ins.encode(f)) for f in twice]
        batch = ins.generate_batch(items, ins.grammar, ins.max_tokens)
        sampled = ins.generate_batch([Prompt(*items[0], ins.grammar, ins.max_tokens, Sampling(0.8, seed=1))],
                                     ins.grammar, ins.max_tokens)
    assert [g.token_ids for g in batch] == [g.token_ids for g in base]
    assert [g.drafted for g in batch] == [0, 0]  # two rows share the step: batching, not guessing
    assert sampled[0].drafted == 0 and sampled[0].tokens > 0


def test_a_pair_draft_reads_the_image_at_its_positions(tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Qwen2.5-VL: libmtmd's image with M-RoPE positions goes into the draft's context too."""
    pair = tiny_pairs("qwen2.5-vl")
    bundle = load_bundle(write_pair_bundle(pair, tmp_path / "qwen"))
    config = Config(device_id="test-device")
    config.model.threads = 2
    frames = synthetic_frames(3, seed=2)
    with _inspector(bundle, config, None) as ins:
        base = _verdicts(ins, frames)
    with _inspector(bundle, config, bundle.language_path) as ins:
        assert ins.language.drafter is not None and ins.language.drafter.sees_images
        got = _verdicts(ins, frames)
    assert [g.token_ids for g in got] == [g.token_ids for g in base]
    drafted, accepted = sum(g.drafted for g in got), sum(g.draft_accepted for g in got)
    assert drafted > 0 and accepted == drafted  # it saw what the model saw, image included


def test_a_draft_of_another_vocabulary_is_refused(demo_bundle: Bundle, config: Config, tmp_path: Path) -> None:
    other = tmp_path / "other-vocab.gguf"
    write_demo_language(other, vocab=2048)
    with pytest.raises(ConfigError, match=r"model\.draft_model"):
        _inspector(demo_bundle, config, other)


def test_a_recurrent_language_model_refuses_a_draft(tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """LFM2's convolution state cannot drop the cells of refused guesses as a KV cache does."""
    pair = tiny_pairs("lfm2-vl")
    bundle = load_bundle(write_pair_bundle(pair, tmp_path / "lfm2"))
    config = Config(device_id="test-device")
    with pytest.raises(ConfigError, match="recurrent"):
        _inspector(bundle, config, bundle.language_path)


def test_the_draft_length_grows_shrinks_and_pauses_longer_each_time() -> None:
    length = DraftLength(3)
    for _ in range(6):
        length.timed(False, 0.001, 1)  # plain steps measured: from here one probe in 16 steps (none below)
    assert length.take() == 3
    length.update(3, 3)
    assert length.take() == 3  # capped at the most
    length.update(3, 1)
    assert length.take() == 1  # as many as were right
    length.update(1, 0)  # wrong at one: pause
    assert [length.take() for _ in range(5)] == [0, 0, 0, 0, 1]
    length.update(1, 0)
    assert [length.take() for _ in range(9)] == [0] * 8 + [1]  # twice as long
    length.update(1, 1)
    assert length.take() == 2
    assert (length.proposed, length.accepted) == (9, 5)


def test_a_failing_draft_fails_no_answer_and_recovers(demo_bundle: Bundle, config: Config, drafts: dict[str, Path],
                                                      plain_verdicts: list[Generation],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft's llama_decode refused (its KV full, say): the answers go on without guesses."""
    with _inspector(demo_bundle, config, drafts["itself"]) as ins:
        drafter = ins.language.drafter
        assert drafter is not None
        context = drafter._llm.context

        def refuse(_batch: object) -> None:
            raise DecodeError(1)

        monkeypatch.setattr(context, "decode", refuse)
        failing = _verdicts(ins, FRAMES[:2])
        monkeypatch.undo()
        healed = _verdicts(ins, FRAMES[2:4])
    assert [g.token_ids for g in failing + healed] == [g.token_ids for g in plain_verdicts[:4]]
    assert drafter.failures > 0 and sum(g.drafted for g in failing) == 0
    assert sum(g.draft_accepted for g in healed) > 0


def _guessing(length: DraftLength, steps: int, guessed_ms: float, plain_ms: float) -> list[bool]:
    """Which of `steps` steps guessed, each giving one token in the given time."""
    out = []
    for _ in range(steps):
        guessed = length.take() > 0
        length.timed(guessed, (guessed_ms if guessed else plain_ms) / 1000, 1)
        out.append(guessed)
    return out


def test_guessing_that_costs_more_time_per_token_stops_for_longer_each_time() -> None:
    length = DraftLength(3)
    steps = _guessing(length, 4000, guessed_ms=2.0, plain_ms=1.0)
    assert length.slow_pauses >= 3
    assert sum(steps[2000:]) < sum(steps[:2000]) / 2  # the pauses grow
    assert sum(steps) < 0.1 * len(steps)  # about nothing


def test_guessing_that_saves_time_goes_on_between_plain_probes() -> None:
    length = DraftLength(3)
    steps = _guessing(length, 1000, guessed_ms=0.5, plain_ms=1.0)
    assert length.slow_pauses == 0
    assert sum(steps) >= 0.9 * len(steps)  # one plain step in 16 keeps measuring


def test_a_daemon_with_a_draft_reports_its_guesses_in_status_and_metrics(
        demo_dir: Path, tmp_path: Path) -> None:
    """The camera path of the daemon (worker -> parallel sequences) speculates, and says so."""
    cfg = Config(device_id="draft-test", data_dir=tmp_path / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.model.draft_model = demo_dir / "language.gguf"
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.cameras = [CameraConfig(name="belt", source=str(write_sample_video(tmp_path / "v.avi", frames=20)),
                                fps=20, trigger=TriggerConfig(mode="interval", interval_s=0.2))]
    daemon = Daemon(cfg)
    daemon.start()
    try:
        assert daemon.api is not None
        client = daemon.api.app.test_client()
        wait_for(lambda: daemon.journal.counts()["total"] >= 3, timeout=60, what="three camera verdicts")
        draft = client.get("/api/v1/status").get_json()["inspection"]["draft"]
        assert draft["model"] == "language.gguf" and draft["taken"] > 0 and draft["failures"] == 0
        metrics = client.get("/metrics").get_data(as_text=True)
        assert 'edge_draft_tokens_total{outcome="taken"}' in metrics
    finally:
        daemon.stop()
