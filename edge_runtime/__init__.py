"""edge-runtime: vision-language inspection on edge devices."""

__version__ = "0.1.0"
