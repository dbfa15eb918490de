"""opsynth's committed data, read through ``importlib.resources`` so that a checkout and an
installed wheel find it alike: the KernelBench index (``kernelbench_index.json.gz``) and the
composer's operator profiles (``profiles/``)."""

from importlib import resources
from pathlib import Path


def data_file(*parts: str) -> Path:
    """The path of a committed data file (present on disk in a checkout and in a wheel)."""
    return Path(str(resources.files(__name__).joinpath(*parts)))
