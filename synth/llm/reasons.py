"""Reason codes of the ``compose`` stage, one line each.

Stable strings, counted by the funnel like every other stage's codes; a code is never renamed,
only added. Transport codes mean the candidate never got a usable reply; reply codes mean the
model answered with something that is not a valid task for the sampled ops.
"""

from __future__ import annotations

TRANSPORT: dict[str, str] = {
    "llm_unreachable": "no server answered at compose.llm.base_url (after retries)",
    "llm_auth_failed": "the server refused the API key (401/403)",
    "llm_rate_limited": "the server still answered 429 after compose.llm.max_retries retries",
    "llm_server_error": "the server still answered 5xx after compose.llm.max_retries retries",
    "llm_timeout": "no reply within compose.llm.timeout_s (after retries)",
    "llm_request_refused": "the server refused the request (4xx other than 401/403/429)",
    "llm_bad_response": "the server's answer is not a chat completion (malformed JSON, no choices)",
}

REPLY: dict[str, str] = {
    "empty_reply": "the model returned no text",
    "no_code": "the reply holds no Python code block",
    "syntax_error": "the code does not parse as Python",
    "missing_symbol": "Model, get_inputs or get_init_inputs is not defined at module level",
    "no_op_list": "the reply does not end with the final op list (OPS: [...])",
    "op_list_mismatch": "the final op list is not the sampled ops",
    "op_unused": "the code never uses one of the sampled ops",
    "truncated": "the reply hit compose.llm.max_tokens before the code or the op list ended",
}

ALL: dict[str, str] = {
    "ok": "the reply is a well-formed task for the sampled ops",
    **TRANSPORT,
    **REPLY,
}
