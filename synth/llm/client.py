"""One chat completion from an OpenAI-compatible server, with retries and backoff.

The ``openai`` client's own retries are off so that every retry is counted and every failure
ends as one of our reason codes (``synth.llm.reasons.TRANSPORT``). 429, 5xx, timeouts and
refused connections are retried with exponential backoff (a server's ``Retry-After`` wins, up
to ``backoff_max_s``); a refused key or request is not. Once the server is found unreachable
or the key refused, the remaining requests of the call fail at once with the same reason
instead of each waiting out its own retries.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import openai

from opsynth.config import LlmConfig
from opsynth.synth.llm.prompts import Messages

# Without a key the client refuses to start; local servers accept any, OpenAI answers 401.
NO_KEY = "no-key"
_FATAL = ("llm_unreachable", "llm_auth_failed")


class LlmFailure(Exception):
    """A request that got no usable completion; ``reason`` is in ``TRANSPORT``."""

    def __init__(self, reason: str, detail: str = "", retries: int = 0) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail, self.retries = reason, detail, retries


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    retries: int = 0

    def record(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


def request_params(cfg: LlmConfig, seed: int) -> dict[str, Any]:
    """The sampling parameters sent with every request; part of the cache key."""
    return {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "seed": seed}


class ChatClient:
    def __init__(self, cfg: LlmConfig, sleep=time.sleep) -> None:
        self.cfg, self.sleep = cfg, sleep
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self.client = openai.OpenAI(
            base_url=cfg.base_url or None,
            api_key=key or NO_KEY,
            timeout=cfg.timeout_s,
            max_retries=0,
        )
        self.key_note = "" if key else f" (${cfg.api_key_env} is unset)"
        self._fatal: LlmFailure | None = None
        self._lock = threading.Lock()

    def complete(self, messages: Messages, params: dict[str, Any]) -> Completion:
        """One completion; raises LlmFailure after the retries the failure allows."""
        retries = 0
        while True:
            if self._fatal is not None:
                raise LlmFailure(self._fatal.reason, f"not sent: {self._fatal.detail}")
            try:
                return self._once(messages, params, retries)
            except _Retry as retry:
                if retries >= self.cfg.max_retries:
                    failure = LlmFailure(retry.reason, retry.detail, retries)
                    self._note_fatal(failure)
                    raise failure from None
                self.sleep(self._delay(retries, retry.after))
                retries += 1
            except LlmFailure as failure:
                failure.retries = retries
                self._note_fatal(failure)
                raise

    def _note_fatal(self, failure: LlmFailure) -> None:
        if failure.reason in _FATAL:
            with self._lock:
                self._fatal = self._fatal or failure

    def _delay(self, retries: int, after: float | None) -> float:
        delay = after if after is not None else self.cfg.backoff_s * 2**retries
        return min(max(delay, 0.0), self.cfg.backoff_max_s)

    def _once(self, messages: Messages, params: dict[str, Any], retries: int) -> Completion:
        try:
            response = self.client.chat.completions.create(
                model=self.cfg.model, messages=messages, **params
            )
        except openai.APITimeoutError as exc:
            raise _Retry("llm_timeout", f"no reply within {self.cfg.timeout_s:g} s") from exc
        except openai.APIConnectionError as exc:
            where = self.cfg.base_url or "the default endpoint"
            raise _Retry("llm_unreachable", f"{where}: {_cause(exc)}") from exc
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise LlmFailure("llm_auth_failed", _status(exc) + self.key_note) from exc
        except openai.RateLimitError as exc:
            raise _Retry("llm_rate_limited", _status(exc), _retry_after(exc)) from exc
        except openai.InternalServerError as exc:
            raise _Retry("llm_server_error", _status(exc), _retry_after(exc)) from exc
        except openai.APIStatusError as exc:
            raise LlmFailure("llm_request_refused", _status(exc)) from exc
        except (openai.APIResponseValidationError, ValueError, TypeError) as exc:
            raise LlmFailure("llm_bad_response", f"{type(exc).__name__}: {exc}") from exc
        return _completion(response, retries)


class _Retry(Exception):
    def __init__(self, reason: str, detail: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.detail, self.after = reason, detail, after


def _completion(response: Any, retries: int) -> Completion:
    """The first choice's text and the token counts; a body without them is a bad response."""
    try:
        choice = response.choices[0]
        text = choice.message.content or ""
        usage = response.usage
        return Completion(
            text=text,
            finish_reason=str(choice.finish_reason or ""),
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            retries=retries,
        )
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        detail = f"no choices[0].message in the reply ({type(exc).__name__})"
        raise LlmFailure("llm_bad_response", detail) from exc


def _status(exc: openai.APIStatusError) -> str:
    return f"HTTP {exc.status_code}: {str(exc.message)[:300]}"


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}"[:300] if cause else str(exc)[:300]


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
