"""Errors a user can cause and fix; the CLI prints their message as one line, no traceback."""


class EdgeRuntimeError(Exception):
    """Base class: the message is one sentence that says what is wrong and where."""


class ConfigError(EdgeRuntimeError):
    """The configuration file is missing, malformed or has a wrong key or value."""


class BundleError(EdgeRuntimeError):
    """A model bundle is missing a file, is corrupt, or its halves do not fit together."""


class ImageError(EdgeRuntimeError):
    """An input image is empty, corrupt, of an unsupported format, or of unacceptable size."""


class ImageTooLarge(ImageError):
    """The image declares more pixels than allowed (a decompression bomb or a wrong camera mode)."""


class InferenceError(EdgeRuntimeError):
    """The model ran but did not produce a usable verdict (e.g. ran out of tokens)."""


class StorageFull(EdgeRuntimeError):
    """The journal cannot store a verdict (disk full): nothing is inspected or published until space
    returns, which heals by itself. The HTTP layer answers 503; MQTT commands reply with the message."""


class InputError(EdgeRuntimeError):
    """A client's input is refused before it costs anything: too large, too complex or malformed.

    `field` names the offending request field (dotted path, e.g. ``response_format.json_schema``);
    the HTTP layer answers `status` (4xx) with this message, MQTT commands reply with it.
    """

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


class NoRoomToAnswer(InputError):
    """A prompt that fits the context but leaves less than max_tokens for the answer. Named `max_tokens`, the
    field a chat client sets; `naming_prompt()` says it for a route whose client sets only the prompt."""

    def __init__(self, prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
        super().__init__(f"max_tokens: prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
                         f"context size {n_ctx}; at most {n_ctx - prompt_tokens} fit", field="max_tokens")
        self.prompt_tokens, self.max_tokens, self.n_ctx = prompt_tokens, max_tokens, n_ctx

    def __reduce__(self) -> tuple[type[InputError], tuple[int, int, int], dict[str, object]]:
        # Exceptions unpickle as type(*args): args holds only the message, which __init__ does not take
        # (and neither could a QuestionRefused whose cause is one be unpickled).
        return type(self), (self.prompt_tokens, self.max_tokens, self.n_ctx), dict(self.__dict__)

    def naming_prompt(self) -> str:
        return (f"prompt: {self.prompt_tokens} tokens leave no room for the {self.max_tokens}-token answer in "
                f"the {self.n_ctx}-token context")

    def naming(self, field: str) -> str:
        """Said to a chat client that set the answer's length as `field` (max_completion_tokens)."""
        return str(self).replace("max_tokens", field)

    def naming_messages(self) -> str:
        """Said to a chat client that set no answer length (the model's default was used), as OpenAI's
        "maximum context length" error says it."""
        room = self.n_ctx - self.prompt_tokens
        return (f"messages: this model's maximum context length is {self.n_ctx} tokens; the messages take "
                f"{self.prompt_tokens} tokens and the default answer length is {self.max_tokens} tokens "
                f"({self.prompt_tokens + self.max_tokens} in all); shorten the messages"
                + (f", or send max_tokens of at most {room}" if room >= 1 else ""))


class QuestionRefused(InputError, InferenceError):
    """A frame whose question cannot be asked (longer than the context once laid around the frame): an
    InputError naming the field, so a client's request is answered with a 4xx and a camera's is logged as
    its configured question, and an InferenceError too, so a batch reports it in that frame's place."""

    def __init__(self, message: str, field: str | None = None, status: int = 400,
                 cause: InputError | None = None) -> None:
        super().__init__(message, field, status)
        self.cause = cause  # the model layer's refusal it stands for (naming_prompt words it for a frame)


def naming_prompt(exc: InputError) -> InputError:
    """A frame's question refused by the model layer, named as the routes that ask one call it (`prompt`):
    the model layer names the chat endpoint's fields, `messages` for the text and `max_tokens` for the
    answer's room, which a REST or MQTT trigger does not have. A QuestionRefused stays one."""
    cause = exc.cause if isinstance(exc, QuestionRefused) else exc
    if isinstance(cause, NoRoomToAnswer):
        message = cause.naming_prompt()
    elif exc.field == "messages":
        message = f"prompt: {str(exc).removeprefix('messages: ')}"
    else:
        return exc
    if isinstance(exc, QuestionRefused):
        return QuestionRefused(message, "prompt", exc.status)
    return InputError(message, "prompt", exc.status)


def naming_answer(exc: InputError, sent: str | None) -> InputError:
    """A chat refused for its answer's room (NoRoomToAnswer, named `max_tokens`), named as its client set that
    room: `sent`, the request's field (max_tokens or max_completion_tokens), or `messages` when it sent
    neither and the model's default answer length did not fit. A QuestionRefused stays one."""
    cause = exc.cause if isinstance(exc, QuestionRefused) else exc
    if not isinstance(cause, NoRoomToAnswer) or sent == "max_tokens":
        return exc
    field, message = ("messages", cause.naming_messages()) if sent is None else (sent, cause.naming(sent))
    if isinstance(exc, QuestionRefused):
        return QuestionRefused(message, field, exc.status, cause)
    return InputError(message, field, exc.status)


class QueueFull(EdgeRuntimeError):
    """The inspection queue is full; retry later (the API answers 429 with Retry-After)."""


class UnknownCamera(EdgeRuntimeError):
    """No camera of that name is configured."""
