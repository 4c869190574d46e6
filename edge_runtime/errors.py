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
