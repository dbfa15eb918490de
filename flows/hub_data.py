"""Reading a dataset from the Hugging Face Hub (or a Hub-compatible ``HF_ENDPOINT``) for the
CLI: audit inputs, report references and the reference data ``opsynth refdata fetch`` keeps.
One place quiets the clients (their retry and progress messages would bury the one-line
error) and turns every failure into that line."""

from __future__ import annotations

from typing import Any


class HubLoadError(ValueError):
    """The dataset could not be loaded; one line naming it, without the fix the caller adds."""


def load_hub_dataset(repo_id: str, split: str | None = "train") -> Any:
    """``datasets.load_dataset(repo_id, split=split)``: one split, or every split (a
    ``DatasetDict``) when ``split`` is None. Network, auth, a missing repo or bad files all
    raise HubLoadError."""
    try:
        import datasets
        from huggingface_hub.utils import logging as hub_logging

        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        hub_logging.set_verbosity_error()
        return datasets.load_dataset(repo_id, split=split)
    except Exception as exc:
        raise HubLoadError(
            f"{repo_id}: could not load it from the Hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})"
        ) from exc
