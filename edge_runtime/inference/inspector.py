"""Image -> Result: encode (encoding.py), lay out the prompt (prompting.py), generate (llama.cpp), check
the verdict (schemas.py, results.py).

Two bundle kinds (core/bundle/manifest.py): format 1 (ONNX vision encoder + language GGUF) and format 2 (a
language GGUF + its mmproj GGUF, encoded by libmtmd, llm/mtmd.py); both end in the same prompt
segments and the same generation path (prefix reuse, batched sequences, constraints).

The work is split in two halves so a caller can overlap them: `encode()` (preprocess + vision,
thread-safe) and `generate()` (the language model, one at a time under a lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any

import numpy as np
from jsonschema import Draft202012Validator

from edge_runtime.config import CameraConfig, ImageLimits, ModelConfig
from edge_runtime.config.line_io import StationConfig
from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.batch import BatchJob, ChatWork, ClipFrame, Encoded
from edge_runtime.core.bundle.manifest import Bundle, Manifest
from edge_runtime.core.device import ModelInfo
from edge_runtime.core.errors import BundleError, InferenceError, InputError
from edge_runtime.core.heap import release_freed_memory
from edge_runtime.core.result import Result
from edge_runtime.inference.encoder_cache import Box, EncoderCache
from edge_runtime.inference.encoding import FrameEncoder, encoded_bytes, encoder_identity
from edge_runtime.inference.llm.feed import Generation, Head, ImagePart
from edge_runtime.inference.llm.grammar import schema_to_grammar
from edge_runtime.inference.llm.model import LanguageModel
from edge_runtime.inference.llm.mtmd import MtmdContext
from edge_runtime.inference.llm.picker import GREEDY, Sampling
from edge_runtime.inference.llm.sequence import Item, Prompt
from edge_runtime.inference.program_fit import (
    askers,
    check_context,
    check_frame_budgets,
    loaded_reference_tokens,
    onnx_image_tokens,
    question_tokens,
)
from edge_runtime.inference.programs import LoadedProgram, ReferenceMemory, changed_references, load_programs
from edge_runtime.inference.prompting import PromptBuilder
from edge_runtime.inference.regions import RegionsEncoded, judge
from edge_runtime.inference.results import RegionsCollected, frame_result, refused, regions_result
from edge_runtime.inference.schemas import SchemaRules, VerdictRules
from edge_runtime.inference.vision import Preprocessor, VisionEncoder

log = logging.getLogger(__name__)
_WARMUP_SIZE = (448, 336)  # the grey warm-up frame of a format-2 bundle (width, height)

Work = BatchJob | ChatWork  # what `Inspector.serve` generates: a camera's verdict or a chat completion
Served = Callable[[Work, Result | Generation | Exception], None]


class Inspector:
    """One loaded bundle serving every camera and API request."""

    def __init__(self, bundle: Bundle, settings: ModelConfig, device_id: str,
                 encoder_cache: EncoderCache[Encoded] | None = None) -> None:
        self.bundle = bundle
        self.settings = settings
        self.device_id = device_id
        m = bundle.manifest
        onnx = m if isinstance(m, Manifest) else None
        self.preprocessor: Preprocessor | None = Preprocessor(onnx.preprocess) if onnx is not None else None
        self.vision: VisionEncoder | None = None
        self.mtmd: MtmdContext | None = None
        lanes: list[MtmdContext] = []  # libmtmd contexts beside self.mtmd (model.encoder_lanes)
        self._lock = threading.Lock()
        self.ready = False
        # Every step below may fail (a bad file, a refused grammar, the warm-up): the stack frees
        # what the steps before it built, so a failed load or reload leaks no native memory.
        with ExitStack() as stack:
            self.language = stack.enter_context(LanguageModel(
                bundle.language_path, settings.context_size, settings.threads, settings.gpu_layers,
                settings.batch_size, settings.reuse_prefix_cache, settings.kv_cache_type,
                settings.constraint_engine, settings.fast_forward, m.files.language.sha256,
                settings.batch_kv_cache, settings.flash_attention_on(), settings.draft_model,
                settings.draft_tokens, settings.steady_steps))
            if onnx is None:  # format 2: libmtmd encodes with the mmproj, over the loaded language model
                assert bundle.mmproj_path is not None and m.mtmd is not None
                self.mtmd = stack.enter_context(MtmdContext(
                    bundle.mmproj_path, self.language.model_ptr, settings.threads, settings.gpu_layers != 0,
                    m.mtmd.image_max_tokens))
                lanes = [stack.enter_context(MtmdContext(
                    bundle.mmproj_path, self.language.model_ptr, settings.threads, settings.gpu_layers != 0,
                    m.mtmd.image_max_tokens)) for _ in range(settings.encoder_lanes - 1)]
            else:
                vision_path = bundle.vision_path
                if settings.vision_precision == "fp16" and bundle.vision_fp16_path is not None:
                    vision_path = bundle.vision_fp16_path
                assert vision_path is not None
                self.vision = stack.enter_context(VisionEncoder(vision_path, onnx.vision.input, onnx.vision.output,
                                                                settings.providers, settings.threads))
            self.encoder_cache: EncoderCache[Encoded] = (
                encoder_cache if encoder_cache is not None
                else EncoderCache(settings.encoder_cache_mb * 1024 * 1024, encoded_bytes))
            self.encoder = FrameEncoder(self.preprocessor, self.vision, self.mtmd, self.encoder_cache,
                                        encoder_identity(m, settings, self.vision, self.mtmd), lanes)
            stack.callback(self.encoder.close)  # its encodes end before the contexts they use are freed
            self.default_prompt = settings.prompt or m.prompt.default
            self.max_tokens = settings.max_tokens or m.generation.max_tokens
            try:  # a schema the grammar cannot hold the model to, or the engine cannot take
                self.grammar = schema_to_grammar(m.verdict_schema, "verdict_schema")
                self.language.check_grammar(self.grammar)
            except InputError as exc:
                why = str(exc).removeprefix("response_format.json_schema: ").removeprefix("verdict_schema: ")
                raise BundleError(f"{bundle.root / 'bundle.yaml'}: verdict_schema: {why}") from None
            self.validator = Draft202012Validator(m.verdict_schema)
            self.schemas = SchemaRules(VerdictRules(self.grammar, self.validator), self.language.check_grammar)
            # Inspection programs (programs.py): by name, and the one each camera names; replaced whole.
            self._programs: tuple[dict[str, LoadedProgram], dict[str, LoadedProgram]] = ({}, {})
            self.prompts = PromptBuilder(bundle, self.language, settings.token_cache_bytes, self.mtmd is not None)
            self.max_prompt_bytes = self.prompts.max_prompt_bytes
            if settings.warmup:
                self.warm_up()
            self._stack = stack.pop_all()
        self.ready = True

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def model_name(self) -> str:
        return self.bundle.name

    def warm_up(self) -> None:
        """One full inspection of a grey frame: allocates buffers, fills the prefix cache."""
        t0 = time.perf_counter()
        m = self.bundle.manifest
        width, height = (m.preprocess.width, m.preprocess.height) if isinstance(m, Manifest) else _WARMUP_SIZE
        self.inspect(np.full((height, width, 3), 127, np.uint8), camera="warmup")
        log.info("inspector: warmed up in %.0f ms", (time.perf_counter() - t0) * 1000)

    @property
    def image_budget(self) -> int:
        """The image token budget the encoder runs under (libmtmd's image_max_tokens; 0: fixed)."""
        return self.encoder.image_budget

    @property
    def several_images(self) -> bool:
        """Whether a prompt may hold several images (a GGUF + mmproj bundle's)."""
        return self.encoder.several_images

    def info(self, context_size: int) -> ModelInfo:
        """What `/v1/models`, the status page and the review loop show of this model."""
        manifest = self.bundle.manifest
        return ModelInfo(str(manifest.name), self.model_name, self.ready, self.max_tokens, context_size,
                         manifest.verdict_schema, self.several_images)

    def encode(self, frame: np.ndarray, crop: Box | None = None, digest: str | None = None,
               tokens: tuple[int, int] | None = None) -> Encoded:
        """The frame's (or its `crop`'s) image embeddings, through the encoder cache (encoding.py)."""
        return self.encoder.encode(frame, crop, digest, tokens)

    def encode_frame(self, camera: str, frame: np.ndarray, clip: Sequence[ClipFrame] | None = None,
                     program_name: str | None = None) -> Encoded:
        """A camera's frame encoded as its program asks: each region's crop (the frame hashed once for
        the encoder cache), each frame of its clip (clips.py), or the whole frame. `program_name`: a line
        recipe's program in place of the camera's."""
        return self.encoder.encode_program(frame, camera, self.program_of(camera, program_name), clip,
                                           self.language.n_embd)

    def sequence(self, prompt: str, enc: Encoded | Sequence[Encoded] | None, system: str | None = None,
                 field: str = "messages", image_at: Sequence[int] = ()) -> tuple[list[int], ImagePart, list[int]]:
        """(prefix, image part, suffix) of one inspection: the prompt template with the image in place
        (prompting.py; `image_at`: each image at its offset in `prompt`)."""
        return self.prompts.sequence(prompt, enc, system, field, image_at)

    def frame_sequence(self, camera: str, prompt: str, enc: Encoded, field: str = "prompt",
                       program_name: str | None = None) -> tuple[Head, ImagePart, list[int]]:
        """A camera's frame (or clip) as a prompt: under its program (references before the frame, all of
        it up to the frame one shared `Prefix`), or the plain layout of `sequence`."""
        return self.prompts.program_sequence(self.program_of(camera, program_name), prompt, enc, field)

    def prompt_parts(self, prompt: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the image for this question (bundles without an image layout)."""
        return self.prompts.prompt_parts(prompt)

    def use_programs(self, programs: Mapping[str, ProgramConfig], cameras: Sequence[CameraConfig],
                     limits: ImageLimits, stations: Sequence[StationConfig] = (),
                     fit: Callable[[ReferenceMemory], None] | None = None) -> None:
        """Load the config's inspection programs: every reference read, counted, then each distinct image
        encoded once (one the running programs hold is reused: a reload with the same references encodes
        nothing). All or nothing: on a ConfigError (one line naming the program and the file) the programs
        in use stay. `stations`: the line stations whose recipes (or themselves) name a program, checked
        like the cameras that do. `fit` sees what the references will hold before any is encoded and may
        refuse it (memory_fit.references_check)."""
        mtmd = self.encoder.mtmd
        loaded = load_programs(programs, cameras, limits, lambda f, t: self.encode(f, tokens=t),
                               self.several_images, self.bundle.name, self.image_budget,
                               self.bundle.manifest.verdict_schema,
                               self.encoder.reference_bytes if mtmd is not None else None, fit,
                               mtmd.n_embd if mtmd is not None else 0, self._programs[0])
        asked = askers(programs, cameras, stations)  # cameras, line stations and their recipes
        budgets = {name: p.tokens for name, p in loaded[0].items()}
        check_frame_budgets(budgets, asked, self.encoder.mtmd)
        m = self.bundle.manifest
        text = question_tokens(m.prompt.template, m.prompt.system, m.prompt.default, self.prompts.tokenize,
                               self.language.with_bos if self.encoder.mtmd is not None else list)
        check_context(programs, budgets, loaded_reference_tokens(loaded[0]), asked, self.encoder.mtmd,
                      self.max_tokens, self.language.n_ctx, text, onnx_image_tokens(m))
        self._programs = loaded

    @property
    def programs_loaded(self) -> object:
        """The inspection programs in use, replaced whole by `use_programs`: the worker tells a frame it
        encoded under older ones by this object's identity."""
        return self._programs

    def changed_references(self) -> list[str]:
        """The running programs' references whose file changed on disk since it was encoded."""
        return changed_references(self._programs[0])

    def program_of(self, camera: str, program: str | None = None) -> LoadedProgram | None:
        """The program a frame is inspected with: `program` by name (a line recipe's), else the camera's.
        InputError naming `program` when that name is not loaded (a reload refused the programs)."""
        if program is None:
            return self._programs[1].get(camera)
        found = self._programs[0].get(program)
        if found is None:
            raise InputError(f"program: no inspection program {program!r} is loaded", field="program")
        return found

    def constraint(self, schema: dict[str, Any]) -> str:
        """A client's JSON schema as a grammar, checked by the budget and by this model's constraint
        engine before anything is queued (InputError naming response_format.json_schema)."""
        grammar = schema_to_grammar(schema)
        self.language.check_grammar(grammar)
        return grammar

    def generate(self, prefix: Head, image: ImagePart, suffix: list[int],
                 grammar: str | None, max_tokens: int, sampling: Sampling = GREEDY,
                 on_text: Callable[[str], None] | None = None, stop: list[str] | None = None) -> Generation:
        with self._lock:
            return self.language.generate(prefix, image, suffix, grammar, max_tokens, sampling, on_text, stop)

    def generate_batch(self, items: Sequence[Item | Prompt], grammar: str | None, max_tokens: int) -> list[Generation]:
        """Several prompts as parallel sequences of one batch: a (prefix, image, suffix) item greedy
        under `grammar`, a `Prompt` with its own grammar, sampling and length."""
        with self._lock:
            return self.language.generate_batch(items, grammar, max_tokens)

    def verdict_rules(self, schema: dict[str, Any] | None) -> VerdictRules:
        """The grammar and validator of a verdict schema (None: the bundle's), built once per schema
        (schemas.py). InputError naming `schema` when the schema is refused."""
        return self.schemas.get(schema)

    def inspect(self, frame: np.ndarray, *, camera: str = "api", prompt: str | None = None,
                seq: int = 0, capture_ms: float = 0.0, governor: dict[str, Any] | None = None,
                encoded: Encoded | None = None, schema: dict[str, Any] | None = None,
                program: str | None = None) -> Result:
        """Run the whole pipeline on one BGR frame and return a Result valid against `schema`
        (None: the bundle's verdict_schema), under `program` by name (None: the camera's)."""
        rules = self.verdict_rules(schema)  # a refused schema costs no encode
        enc = encoded or self.encode_frame(camera, frame, program_name=program)
        loaded = self.program_of(camera, program)
        if isinstance(enc, RegionsEncoded) or (loaded is not None and loaded.references):
            # Regions: every region a sequence of one batch. References: the parallel slots keep the
            # program's prefix KV beside other prefixes (the main context keeps one: a camera without
            # references, or an API request, between two frames would make it decode the references again).
            served: list[Result | Generation | Exception] = []
            self.serve([BatchJob(enc, camera, prompt, seq, capture_ms, governor, schema, program)],
                       lambda _w, outcome: served.append(outcome))
            if isinstance(served[0], Exception):
                raise served[0]
            assert isinstance(served[0], Result)
            return served[0]
        t0 = time.perf_counter()
        question = prompt or self.default_prompt
        prefix, image, suffix = self.frame_sequence(camera, question, enc, program_name=program)
        gen = self.generate(prefix, image, suffix, rules.grammar, self.max_tokens)
        return self._result(enc, gen, question, camera, seq, capture_ms, governor, t0, rules)

    def inspect_batch(self, jobs: list[BatchJob]) -> list[Result | InferenceError]:
        """Several encoded frames (e.g. from different cameras) generated as parallel sequences, each
        under its own job's schema. A job whose schema is refused fails alone (InputError inside)."""
        if any(isinstance(job.encoded, RegionsEncoded) for job in jobs):  # frames of several sequences each
            served: dict[int, Result | InferenceError] = {}

            def finished(w: Work, outcome: Result | Generation | Exception) -> None:
                served[id(w)] = (outcome if isinstance(outcome, Result | InferenceError)
                                 else refused(outcome) if isinstance(outcome, InputError)
                                 else InferenceError(str(outcome)))

            self.serve(jobs, finished)
            return [served[id(job)] for job in jobs]
        t0 = time.perf_counter()
        questions = [job.prompt or self.default_prompt for job in jobs]
        out: list[Result | InferenceError | None] = [None] * len(jobs)
        prompts, ruled = [], []
        for i, (job, question) in enumerate(zip(jobs, questions, strict=True)):
            try:
                rules = self.verdict_rules(job.schema)
                prompt = Prompt(*self.frame_sequence(job.camera, question, job.encoded, program_name=job.program),
                                rules.grammar, self.max_tokens)
                self.language.check_prompt(prompt)  # one question too long for the context fails alone
            except InputError as exc:
                out[i] = refused(exc)
                continue
            prompts.append(prompt)
            ruled.append((i, rules))
        gens = self.generate_batch(prompts, self.grammar, self.max_tokens) if prompts else []
        for (i, rules), gen in zip(ruled, gens, strict=True):
            job = jobs[i]
            try:
                out[i] = self._result(job.encoded, gen, questions[i], job.camera, job.seq, job.capture_ms,
                                      job.governor, t0, rules)
            except InferenceError as exc:
                out[i] = exc
        return [o for o in out if o is not None]

    def serve(self, work: Sequence[Work], finished: Served, admit: Callable[[int], Sequence[Work]] | None = None
              ) -> int:
        """Camera verdicts and chat completions as parallel sequences that join and leave between
        steps; `finished` hears of each piece of work once: its Result (a verdict), its Generation (a
        chat) or why it failed. `admit(n)` hands over up to n more that are ready now (never blocks).
        Returns the most sequences that ran at once."""
        started: dict[int, float] = {}

        def prompts(batch: Sequence[Work]) -> list[Prompt]:
            out = []
            for w in batch:
                started[id(w)] = time.perf_counter()
                try:
                    if isinstance(w, BatchJob) and isinstance(w.encoded, RegionsEncoded):
                        regions, collected = self._region_prompts(w, w.encoded)
                        if not regions:  # no region could be asked: the frame's outcome is known now
                            finished(w, self._settled(w, collected, started.pop(id(w))))
                        out.extend(regions)
                    else:
                        out.append(self._prompt(w))
                except (InputError, InferenceError) as exc:
                    finished(w, exc)
            return out

        def done(prompt: Prompt, outcome: Generation | Exception) -> None:
            w, rules, *region = prompt.tag
            if region:  # one region of a frame: the frame is finished with its last region
                collected: RegionsCollected = region[0]
                collected.add(region[1], rules, outcome)
                if collected.pending == 0:
                    finished(w, self._settled(w, collected, started.pop(id(w), time.perf_counter())))
                return
            t0 = started.pop(id(w), time.perf_counter())
            served: Result | Generation | Exception = outcome
            if isinstance(w, BatchJob) and isinstance(outcome, Generation):
                try:
                    served = self._result(w.encoded, outcome, w.prompt or self.default_prompt, w.camera, w.seq,
                                          w.capture_ms, w.governor, t0, rules)
                except InferenceError as exc:
                    served = exc
            finished(w, served)

        more = None if admit is None else (lambda n: prompts(admit(n)))
        with self._lock:
            return self.language.serve(prompts(work), done, more)

    def _region_prompts(self, w: BatchJob, enc: RegionsEncoded) -> tuple[list[Prompt], RegionsCollected]:
        """One prompt per region that has an encoding, tagged with what collects the frame's regions."""
        program = self.program_of(w.camera, w.program)
        nok_field = program.config.nok_field if program is not None and program.config is not None else "defect"
        collected = RegionsCollected(enc, nok_field, self.parse_verdict)
        prompts = []
        for k, (spec, renc) in enumerate(enc.regions):
            if isinstance(renc, Exception):
                collected.outcomes[k] = judge(spec, None, "", nok_field, str(renc))
                continue
            if k in enc.answered:  # the anomaly gate's OK (skip_ok): this region is not asked
                collected.answered(k, enc.answered[k])
                continue
            try:
                rules = self.verdict_rules(spec.schema if spec.schema is not None else w.schema)
                question = spec.prompt or w.prompt or self.default_prompt
                prompts.append(Prompt(*self.frame_sequence(w.camera, question, renc, "prompt", w.program),
                                      rules.grammar, self.max_tokens, tag=(w, rules, collected, k)))
            except (InputError, InferenceError) as exc:
                collected.failed(k, exc)
        collected.pending = len(prompts)
        return prompts, collected

    def _settled(self, w: BatchJob, collected: RegionsCollected, t0: float) -> Result | Exception:
        """A frame's Result from its regions' outcomes (results.py)."""
        return regions_result(self.device_id, self.model_name, w, collected, w.prompt or self.default_prompt, t0)

    def _prompt(self, w: Work) -> Prompt:
        """The sequence of one piece of work with how it is generated."""
        if isinstance(w, BatchJob):
            rules = self.verdict_rules(w.schema)
            question = w.prompt or self.default_prompt
            return Prompt(*self.frame_sequence(w.camera, question, w.encoded, program_name=w.program), rules.grammar,
                          self.max_tokens, tag=(w, rules))
        job = w.job

        def encode(image: np.ndarray, i: int) -> Encoded:
            try:
                return self.encode(image)
            except InputError as exc:  # named by its own part of the request
                raise job.image_refused(exc, i) from None

        enc = w.encoded
        if enc is None and job.image is not None:
            enc = encode(job.image, 0)  # not encoded ahead (overlap off, or a reload meanwhile)
        if self.mtmd is not None and job.more_images:  # refused before any further image is encoded
            self.prompts.check_images_fit(job, enc, self.encoder.image_tokens)
        first = 0 if job.image is None else 1
        encs = ([] if enc is None else [enc]) + [encode(img, first + i) for i, img in enumerate(job.more_images)]
        prefix, image, suffix = self.sequence(job.prompt, encs, job.system, image_at=job.image_at)
        return Prompt(prefix, image, suffix, job.grammar, job.max_tokens or self.max_tokens,
                      Sampling(job.temperature, job.top_p, job.seed), tuple(job.stops), job.on_text, tag=(w, None))

    def _result(self, enc: Encoded, gen: Generation, question: str, camera: str, seq: int, capture_ms: float,
                governor: dict[str, Any] | None, t0: float, rules: VerdictRules | None = None) -> Result:
        return frame_result(self.device_id, self.model_name, enc, self.parse_verdict(gen, rules), gen, question,
                            camera, seq, capture_ms, governor, t0)

    def parse_verdict(self, gen: Generation, rules: VerdictRules | None = None) -> dict[str, Any]:
        """The verdict of a generation, checked against `rules`' schema (None: the bundle's)."""
        return self.schemas.parse(gen, rules, self.max_tokens)

    def close(self) -> None:
        """Free the language model and the vision encoder (waits for a generation in progress, and for
        the encodes inside libmtmd: FrameEncoder.close)."""
        self.ready = False
        with self._lock:
            self._stack.close()  # idempotent: a second close() finds the stack empty
        # The model's buffers were freed from many native threads, into glibc arenas that keep the pages:
        # without a trim every model swap left the daemon 1.3-5.7 MB bigger, not levelling off (docs/reliability.md).
        release_freed_memory()
