"""opsynth's shared kernel: the record type, the config and the filter protocol."""

__version__ = "0.1.0"
