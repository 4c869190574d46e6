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


class QueueFull(EdgeRuntimeError):
    """The inspection queue is full; retry later (the API answers 429 with Retry-After)."""


class UnknownCamera(EdgeRuntimeError):
    """No camera of that name is configured."""
